#!/usr/bin/env bash
# Creates .venv and installs everything sglang-ssd needs, from scratch.
# Called by `make install`; safe to re-run (the installer skips what is already satisfied).
#
# The installer is uv (`uv pip install`, pinned in requirements/installer.txt and put into the
# venv by the venv's own pip): on CI's 2-core machine this script took 85 s where pip
# took 206 s (both from empty caches, .pyc compiled; same versions). It honours pip's
# find-links and index settings from the environment (PIP_FIND_LINKS, PIP_INDEX_URL,
# PIP_EXTRA_INDEX_URL), as pip would. SSD_INSTALLER=pip installs with pip alone instead.
#
# Two paths:
# - CPU (no working nvidia-smi): torch's CPU build, SGLang 0.5.23 without its dependencies (they
#   pull a multi-GB CUDA stack) plus the pinned list of what it imports, and the pure-torch
#   stand-in for Intel's CPU `sgl_kernel`.
# - CUDA: SGLang 0.5.23 with its own pinned dependencies (torch 2.14.1, sglang-kernel 0.4.10,
#   flashinfer-python 0.7.2, ...), then the test/eval tools; never the CPU stand-in.
# SSD_INSTALL_CUDA=1/0 forces a path; SSD_INSTALL_DRY_RUN=1 prints the commands instead of running
# them (what `tests/scripts/test_install_paths.py` reads).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
# Not PIP_QUIET: pip reads that name itself and rejects "-q" as its value.
SSD_PIP_FLAGS=${SSD_PIP_FLAGS:--q}
DRY_RUN=${SSD_INSTALL_DRY_RUN:-0}

has_cuda() {
    case "${SSD_INSTALL_CUDA:-}" in
        1) return 0 ;;
        0) return 1 ;;
    esac
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}
run() { if [ "$DRY_RUN" = 1 ]; then echo "+ $*"; else "$@"; fi; }

INSTALLER=${SSD_INSTALLER:-uv}
case "$INSTALLER" in
    uv | pip) ;;
    *) echo "[install] SSD_INSTALLER must be uv or pip, not '$INSTALLER'" >&2; exit 2 ;;
esac

VPY="$VENV/bin/python"
[ -x "$VPY" ] || run "$PYTHON" -m venv "$VENV"
if [ "$INSTALLER" = uv ]; then
    run "$VPY" -m pip install $SSD_PIP_FLAGS --disable-pip-version-check -r requirements/installer.txt
    # pip's settings, in uv's words (uv reads no pip configuration of its own accord).
    UV_ARGS=(--python "$VPY" --compile-bytecode)
    for dir in ${PIP_FIND_LINKS:-$("$VPY" -m pip config get global.find-links 2>/dev/null || true)}; do
        UV_ARGS+=(--find-links "$dir")
    done
    [ -z "${PIP_INDEX_URL:-}" ] || UV_ARGS+=(--index-url "$PIP_INDEX_URL")
    for url in ${PIP_EXTRA_INDEX_URL:-}; do UV_ARGS+=(--extra-index-url "$url"); done
    pip_install() { run "$VPY" -m uv pip install $SSD_PIP_FLAGS "${UV_ARGS[@]}" "$@"; }
else
    pip_install() { run "$VPY" -m pip install $SSD_PIP_FLAGS --disable-pip-version-check "$@"; }
fi

if has_cuda; then
    echo "[install] CUDA: sglang 0.5.23 with its pinned CUDA stack (torch, sglang-kernel, flashinfer)"
    pip_install -r requirements/sglang.txt
    pip_install -r requirements/dev.txt
else
    echo "[install] torch"
    # On the development/CI machines pip's find-links (/opt/wheels) holds the CPU build of 2.13.0
    # and pip prefers it; elsewhere set PIP_INDEX_URL=https://download.pytorch.org/whl/cpu.
    pip_install -r requirements/torch.txt

    echo "[install] sglang (no deps) + the pinned list of what it imports"
    pip_install --no-deps -r requirements/sglang.txt
    pip_install -r requirements/runtime.txt -r requirements/dev.txt
fi
pip_install --no-deps -r requirements/datasets-nodeps.txt

echo "[install] sglang-ssd and its kernels (editable)"
pip_install --no-deps --no-build-isolation -e . -e kernels
if ! has_cuda; then
    # Pure-torch stand-in for Intel's CPU `sgl_kernel`; never beside the real CUDA sglang-kernel.
    pip_install --no-deps --no-build-isolation -e kernels/sgl_kernel_shim
fi

echo "[install] placeholders and patches"
run "$VPY" scripts/install_placeholders.py
run "$VPY" scripts/apply_patches.py

run "$VPY" -c "import sglang, sglang_ssd, sglang_ssd_kernels; print('[install] ok: sglang', sglang.__version__)"

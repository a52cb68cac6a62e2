#!/usr/bin/env bash
# Creates .venv and installs everything sglang-ssd needs, from scratch, through pip only.
# Called by `make install`; safe to re-run (pip skips what is already satisfied).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
# Not PIP_QUIET: pip reads that name itself and rejects "-q" as its value.
SSD_PIP_FLAGS=${SSD_PIP_FLAGS:--q}

has_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
VPY="$VENV/bin/python"
pip_install() { "$VPY" -m pip install $SSD_PIP_FLAGS --disable-pip-version-check "$@"; }

echo "[install] torch"
# On the development/CI machines pip's find-links (/opt/wheels) holds the CPU build of 2.13.0 and
# pip prefers it; elsewhere set PIP_INDEX_URL=https://download.pytorch.org/whl/cpu for a CPU box.
pip_install -r requirements/torch.txt

echo "[install] sglang (no deps) + the pinned list of what it imports"
pip_install --no-deps -r requirements/sglang.txt
pip_install -r requirements/runtime.txt -r requirements/dev.txt
pip_install --no-deps -r requirements/datasets-nodeps.txt

echo "[install] sglang-ssd and its kernels (editable)"
pip_install --no-deps --no-build-isolation -e . -e kernels
if ! has_cuda; then
    # Pure-torch stand-in for Intel's CPU `sgl_kernel`; never beside the real CUDA sglang-kernel.
    pip_install --no-deps --no-build-isolation -e kernels/sgl_kernel_shim
fi

echo "[install] placeholders and patches"
"$VPY" scripts/install_placeholders.py
"$VPY" scripts/apply_patches.py

"$VPY" -c "import sglang, sglang_ssd, sglang_ssd_kernels; print('[install] ok: sglang', sglang.__version__)"

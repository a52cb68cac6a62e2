"""`scripts/install.sh` installs a CUDA machine with SGLang's own CUDA stack and a CPU machine
with the CPU build and the `sgl_kernel` stand-in: its dry run's commands."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _plan(cuda: bool, tmp_path: Path) -> list[str]:
    env = dict(os.environ, SSD_INSTALL_DRY_RUN="1", SSD_INSTALL_CUDA="1" if cuda else "0")
    env["VENV"] = str(tmp_path / "venv")  # absent: the dry run prints its creation too
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh")],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return [line[2:] for line in out.splitlines() if line.startswith("+ ")]


def _pip(plan: list[str]) -> list[str]:
    return [cmd.split(" pip install ", 1)[1] for cmd in plan if " pip install " in cmd]


def test_cuda_installs_sglang_with_its_own_pinned_cuda_stack(tmp_path):
    plan = _plan(cuda=True, tmp_path=tmp_path)
    pips = _pip(plan)
    assert plan[0].endswith("-m venv " + str(tmp_path / "venv"))
    sglang = [p for p in pips if "requirements/sglang.txt" in p]
    assert sglang and "--no-deps" not in sglang[0]  # its dependencies come with it
    assert not any("requirements/torch.txt" in p or "runtime.txt" in p for p in pips)
    assert not any("sgl_kernel_shim" in p for p in pips)  # never beside the real kernels
    assert any(" -e . -e kernels" in p for p in pips)
    # What "its own pinned CUDA stack" holds: SGLang 0.5.23's declared dependencies.
    requires = importlib.metadata.requires("sglang") or []
    assert any(r.startswith("sglang-kernel==0.4.10") for r in requires)
    assert any(r.startswith("flashinfer_python") for r in requires)


def test_cpu_installs_the_cpu_build_without_sglangs_dependencies_and_the_stand_in(tmp_path):
    pips = _pip(_plan(cuda=False, tmp_path=tmp_path))
    assert any("requirements/torch.txt" in p for p in pips)
    assert any("--no-deps -r requirements/sglang.txt" in p for p in pips)
    assert any("requirements/runtime.txt" in p for p in pips)
    assert any("sgl_kernel_shim" in p for p in pips)


@pytest.mark.parametrize("cuda", [True, False])
def test_the_dry_run_runs_nothing(tmp_path, cuda):
    _plan(cuda=cuda, tmp_path=tmp_path)
    assert not (tmp_path / "venv").exists()


def test_uv_installs_with_pips_index_settings_and_pip_remains_a_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels/a /wheels/b")
    monkeypatch.setenv("PIP_INDEX_URL", "https://download.pytorch.org/whl/cpu")
    plan = _plan(cuda=False, tmp_path=tmp_path)
    assert plan[1].endswith(
        "pip install -q --disable-pip-version-check -r requirements/installer.txt"
    )
    pips = _pip(plan)
    assert all(" -m uv pip install " in cmd for cmd in plan[2:] if " pip install " in cmd)
    for args in pips[1:]:
        assert "--find-links /wheels/a --find-links /wheels/b" in args
        assert "--index-url https://download.pytorch.org/whl/cpu" in args
        assert "--compile-bytecode" in args

    monkeypatch.setenv("SSD_INSTALLER", "pip")
    plan = _plan(cuda=False, tmp_path=tmp_path)
    assert not any("uv" in cmd.split() or "installer.txt" in cmd for cmd in plan)
    assert any("-m pip install" in cmd and "requirements/torch.txt" in cmd for cmd in plan)


def test_an_unknown_installer_is_refused(tmp_path):
    env = dict(os.environ, SSD_INSTALL_DRY_RUN="1", SSD_INSTALLER="conda", VENV=str(tmp_path))
    out = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "SSD_INSTALLER must be uv or pip" in out.stderr

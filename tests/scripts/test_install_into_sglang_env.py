"""README's install into an existing SGLang environment, `pip install --no-deps -e . -e kernels`,
run for real: into a fresh venv whose site already holds this checkout's pinned SGLang stack
(`.venv`'s site-packages on its path, with the `sgl_kernel` stand-in and the placeholders the
CPU build needs, as a CUDA environment would hold SGLang's own kernels), but not sglang-ssd. The
install must leave torch, sglang and flashinfer (when present) as they were, and the installed
launcher and plugin entry point must work. Offline: no build isolation, nothing downloaded."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = """
import importlib.metadata as m, json
out = {}
for name in ("torch", "sglang", "flashinfer-python", "sglang-ssd", "sglang-ssd-kernels"):
    try:
        dist = m.distribution(name)
        out[name] = [dist.version, str(dist.locate_file(""))]
    except m.PackageNotFoundError:
        out[name] = None
eps = [ep for ep in m.entry_points(group="sglang.srt.plugins") if ep.name == "ssd"]
out["plugin"] = sorted(str(ep.dist.locate_file("")) for ep in eps)
print(json.dumps(out))
"""


def _sglang_env(tmp_path: Path) -> Path:
    """A venv (no pip of its own) that sees `.venv`'s packages without their sglang-ssd."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = Path(site.getsitepackages()[0])
    theirs = next((venv / "lib").glob("python3*/site-packages"))
    shim = next(ours.glob("__editable___sgl_kernel_torch_cpu_*_finder.py"), None)
    lines = [str(ours), str(ROOT / "patches" / "placeholders")]
    if shim is not None:  # the CPU build's sgl_kernel stand-in, part of "SGLang" here
        lines.append(f"import {shim.stem}; {shim.stem}.install()")
    (theirs / "sglang_env.pth").write_text("\n".join(lines) + "\n")
    return venv


def _run(venv: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(venv / "bin" / "python"), *args],
        cwd=venv, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _versions(venv: Path) -> dict:
    run = _run(venv, "-c", VERSIONS)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_install_into_an_existing_sglang_env_changes_nothing_of_it(tmp_path: Path) -> None:
    venv = _sglang_env(tmp_path)
    before = _versions(venv)
    assert before["sglang"] is not None and before["torch"] is not None
    assert _run(venv, "-c", "import sglang_ssd").returncode != 0  # not installed yet
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    install = subprocess.run(
        [*pip, "--no-deps", "--no-build-isolation", "--no-index", "-e", str(ROOT),
         "-e", str(ROOT / "kernels")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    after = _versions(venv)
    for name in ("torch", "sglang", "flashinfer-python"):
        assert after[name] == before[name], name
    for name in ("sglang-ssd", "sglang-ssd-kernels"):  # installed into the new venv itself
        assert after[name] is not None and str(venv) in after[name][1], after[name]
    assert any(str(venv) in path for path in after["plugin"]), after["plugin"]
    helped = _run(venv, "-m", "sglang_ssd.launch_server", "--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "--ssd-mode" in helped.stdout
    plugin = _run(venv, "-c", "import sglang_ssd.plugin as p; print(p.load.__module__)")
    assert plugin.returncode == 0 and plugin.stdout.strip() == "sglang_ssd.plugin", plugin.stderr

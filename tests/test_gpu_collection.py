"""`make gpu-check` collects tests/gpu where sglang, msgspec and pyzmq cannot be imported.

The GPU machine has torch, transformers, triton and pytest but none of those packages, and
nothing installed (docs/design.md#the-gpu-machine); a GPU check that imports them, or a conftest
above
tests/gpu that does, would only fail there. This runs the real Makefile target, collection only,
with a `sitecustomize` that makes the three packages, and tests/conftest.py, unimportable; and
the device script's timing module (`eval.gpu_model`, scripts/gpu_check.sh) must import there too.
No GPU check may set TRITON_INTERPRET (it would run SGLang's Triton kernels on the CPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# sglang_ssd.testing stands for tests/conftest.py, which imports it and must not be loaded (it
# switches Triton to its CPU interpreter, among other things).
BLOCKED = ("sglang", "msgspec", "zmq", "sglang_ssd.testing")


def test_gpu_checks_collect_without_sglang(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(
        f"import sys\nsys.modules.update(dict.fromkeys({BLOCKED!r}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["PYTHONPATH"] = str(tmp_path)
    for name in BLOCKED:
        probe = subprocess.run(
            [sys.executable, "-c", f"import {name}"], env=env, capture_output=True, check=False
        )
        assert probe.returncode != 0, f"{name} is still importable: the block does not work"

    make = ["make", "--no-print-directory", "-C", str(ROOT), "gpu-check"]
    overrides = [f"PYTHON={sys.executable}", "PYTEST_ARGS=--collect-only -q"]
    done = subprocess.run(
        make + overrides, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for module in sorted((ROOT / "tests" / "gpu").glob("test_*.py")):
        assert f"{module.name}::" in output, f"nothing collected from {module.name}:\n{output}"


def test_device_script_imports_without_sglang(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(
        f"import sys\nsys.modules.update(dict.fromkeys({BLOCKED!r}))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "kernels")]))
    probe = subprocess.run(
        [sys.executable, "-c", "import eval.gpu_model, sglang_ssd.speculator.engine"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    for path in sorted((ROOT / "tests" / "gpu").glob("*.py")):
        assert "TRITON_INTERPRET" not in path.read_text(), f"{path.name} sets TRITON_INTERPRET"

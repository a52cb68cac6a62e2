"""`scripts/gpu_check.sh`'s plumbing on the CPU: it runs end to end without CUDA, nvidia-smi or
wheels and prints one `check NAME: passed|failed|skipped (reason)` line per check (each GPU
test's from pytest's JUnit report, `scripts/junit_lines.py`). Here pytest runs one small file
(`SSD_GPU_TESTS`) instead of tests/gpu, whose CUDA cases all skip on the CPU anyway."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from scripts.junit_lines import main as junit_main

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^check \S+: (passed|failed|skipped)( \(.+\))?$")
CHECKS = """
import pytest

pytestmark = pytest.mark.gpu

def test_runs():
    pass

@pytest.mark.skipif(True, reason="no CUDA device")
def test_needs_cuda():
    pass
"""


def test_the_script_runs_without_cuda_and_prints_a_line_per_check(tmp_path: Path) -> None:
    tests = tmp_path / "test_device.py"
    tests.write_text(CHECKS)
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "SSD_GPU_WHEELS": str(tmp_path / "no-wheels"),
        "SSD_GPU_TESTS": str(tests),
        "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin",  # no nvidia-smi
    }
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    assert all(LINE.match(line) for line in lines), lines
    assert "check topo: skipped (no nvidia-smi)" in lines
    assert "check nccl: skipped (no CUDA device)" in lines
    assert any(line.startswith("check wheels: skipped (no wheels in") for line in lines)
    assert any(re.match(r"check (\S+::)?test_runs: passed$", line) for line in lines)
    assert any(
        re.match(r"check (\S+::)?test_needs_cuda: skipped \(no CUDA device\)$", line)
        for line in lines
    )
    assert "check eval.gpu_model: skipped (no CUDA device)" in lines
    out = tmp_path / "out"
    assert (out / "checks.txt").read_text().splitlines() == lines
    assert "torch" in (out / "pip-list.txt").read_text()


def test_a_failed_or_missing_report_is_a_failed_line(tmp_path: Path, capsys) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite><testcase classname="t" name="ok"/>'
        '<testcase classname="t" name="bad"><failure message="assert 1 == 2"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert junit_main(["x", str(report)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "check t::ok: passed",
        "check t::bad: failed (assert 1 == 2)",
    ]
    assert junit_main(["x", str(tmp_path / "missing.xml")]) == 2
    assert capsys.readouterr().out.startswith("check tests/gpu: failed (no readable JUnit report")

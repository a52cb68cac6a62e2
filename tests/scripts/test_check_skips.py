"""`scripts/check_skips.py`: CI fails on any skipped test outside tests/gpu."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts.check_skips import skipped_tests

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_skips.py"
MODULE = """
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="no such device")
def test_marked_skip():
    pass

def test_skips_itself():
    pytest.skip("interpreter cannot run it")

@pytest.mark.xfail(reason="known bug")
def test_known_failure():
    assert False
"""


def _junit(tmp_path: Path, source: str) -> Path:
    """Run pytest on `source` (as tmp_path/test_sample.py) alone; returns its JUnit XML."""
    (tmp_path / "test_sample.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    xml = tmp_path / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
    subprocess.run([*cmd, "test_sample.py"], cwd=tmp_path, capture_output=True, check=False)
    return xml


def _check(xml: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(xml)], capture_output=True, text=True, check=False
    )


def test_every_skip_and_xfail_is_listed_and_fails(tmp_path: Path) -> None:
    xml = _junit(tmp_path, MODULE)
    # By name: the inner run inherits PYTEST_ADDOPTS, which may shuffle its order.
    found = sorted(skipped_tests(xml), key=lambda line: line.split(":")[2])
    assert [line.split(":")[2] for line in found] == [
        "test_known_failure",
        "test_marked_skip",
        "test_skips_itself",
    ]
    assert "no such device" in found[1] and "interpreter cannot run it" in found[2]
    done = _check(xml)
    assert done.returncode == 1
    assert "3 test(s) skipped" in done.stderr and "test_skips_itself" in done.stderr


def test_a_run_without_skips_passes(tmp_path: Path) -> None:
    done = _check(_junit(tmp_path, "def test_runs():\n    pass\n"))
    assert done.returncode == 0, done.stderr
    assert "no test skipped" in done.stdout


def test_gpu_checks_may_skip(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.test_gpu_verify" name="test_greedy_cuda_equals_cpu">'
        '<skipped type="pytest.skip" message="no CUDA device"/></testcase>'
        '<testcase classname="tests.saguaro.test_saguaro_verify" name="test_ok"/>'
        "</testsuite></testsuites>"
    )
    assert skipped_tests(xml) == []
    assert _check(xml).returncode == 0


def test_a_missing_report_is_an_error(tmp_path: Path) -> None:
    done = _check(tmp_path / "absent.xml")
    assert done.returncode != 0 and "absent.xml" in done.stderr

"""`scripts/ci_times.py` on the JUnit XML real pytest runs write (two, read together): module
totals (test classes folded into their module), the `server_start` properties (once each,
though JUnit repeats them per test phase), the total."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import ci_times  # noqa: E402

# As tests/conftest.py records a start-up: a property of the test whose setup started it.
MODULE = f"""
import time
import pytest

@pytest.fixture
def started(request):
    value = {ci_times.server_start_value("tiny-ssd", 12.46, "t/test_slow.py::test_a", 80)!r}
    request.node.user_properties.append(({ci_times.SERVER_PROPERTY!r}, value))

def test_a(started):
    time.sleep(0.3)

class TestGroup:
    def test_b(self):
        time.sleep(0.2)
"""


def test_report_of_real_junit_files(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(MODULE)
    (tmp_path / "test_fast.py").write_text("def test_c():\n    pass\n")
    junit = [tmp_path / "slow.xml", tmp_path / "fast.xml"]
    runs = [["test_slow.py"], ["test_fast.py"]]
    for path, args in zip(junit, runs, strict=True):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                *args,
                f"--junitxml={path}",
            ],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )
    times = ci_times.read_times(*junit)
    names = [module for module, _ in times.modules]
    assert names == ["test_slow.py", "test_fast.py"]
    assert dict(times.modules)["test_slow.py"] >= 0.5
    assert times.servers == [ci_times.ServerStart("tiny-ssd", 12.5, "t/test_slow.py::test_a")]
    assert times.total_s > 0
    text = ci_times.report(times, top=1)
    assert "slowest 1 test modules" in text and "test_fast.py" not in text
    assert "12.5  server tiny-ssd (started for t/test_slow.py::test_a)" in text


def test_classnames_fold_into_their_module() -> None:
    assert ci_times.module_of("tests.eval.test_x.TestY") == "tests/eval/test_x.py"
    assert ci_times.module_of("tests.integration.real_pair.test_greedy") == (
        "tests/integration/real_pair/test_greedy.py"
    )

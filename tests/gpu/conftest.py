"""Setup of the GPU checks: imports from this checkout, a `cuda` fixture, the results' details.

Loaded instead of tests/conftest.py (see pytest.ini). Collecting tests/gpu imports only torch,
pytest, `sglang_ssd.saguaro` and `sglang_ssd_kernels`: the H200 has torch, triton, transformers
and pytest, but no sglang, pyzmq or msgspec, and nothing is installed there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "kernels", ROOT):  # a bare checkout: the packages are not installed
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))
# The KV pool's debug checks, off by default on CUDA (serving), are on in the GPU checks (a
# test that counts syncs as served turns them off itself).
os.environ.setdefault("SGLANG_SSD_KV_POOL_DEBUG", "1")


@pytest.fixture
def cuda() -> torch.device:
    """The CUDA device; the test is skipped, with the reason, where there is none."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device("cuda")


def pytest_report_header() -> str:
    """The environment line of the old pass/fail table: torch version and the GPU, if any."""
    parts = [f"torch {torch.__version__}"]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        parts.append(f"{props.name}, {props.total_memory / 2**30:.0f} GiB")
    else:
        parts.append("no CUDA")
    return "gpu-check: " + ", ".join(parts)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per passed check with what it measured (tests record it as "detail")."""
    lines = [
        f"{report.nodeid}: {value}"
        for report in terminalreporter.stats.get("passed", [])
        if report.when == "call"
        for key, value in report.user_properties
        if key == "detail"
    ]
    if lines:
        terminalreporter.write_sep("=", "gpu-check details")
        for line in lines:
            terminalreporter.write_line(line)

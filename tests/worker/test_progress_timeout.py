"""The speculator timeout is progress-based: the target waits for drafts while
the speculator process keeps using CPU, and gives up after `--ssd-speculator-timeout` seconds
without progress (a SIGSTOPped process) or after `HARD_TIMEOUT_FACTOR` timeouts in all. Real child
processes stand in for the speculator; the link is a stub that answers at a set time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from sglang_ssd.transport import TransportError
from sglang_ssd.worker import speculator_client
from sglang_ssd.worker.speculator_client import SpeculatorClient
from sglang_ssd.worker.supervisor import SpeculatorProcess

TIMEOUT_S = 0.6
REPLY_AFTER_S = 2.0  # > 3 timeouts: only a wait that counts progress gets the reply


class LateLink:
    """Answers the Step's drafts `after` seconds from its creation."""

    def __init__(self, after: float) -> None:
        self.ready_at = time.monotonic() + after

    def recv_drafts(self, step_id: int, timeout_s: float):
        if time.monotonic() + timeout_s >= self.ready_at:
            time.sleep(max(self.ready_at - time.monotonic(), 0.0))
            return ("drafts", step_id)
        time.sleep(timeout_s)
        return None


@pytest.fixture
def child() -> Iterator[SpeculatorProcess]:
    """A busy child process in a `SpeculatorProcess` (its real `alive` and `cpu_seconds`)."""
    process = SpeculatorProcess.__new__(SpeculatorProcess)
    process.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield process
    process.proc.kill()
    process.proc.wait(10)


def _waiter(process: SpeculatorProcess, timeout: float = TIMEOUT_S) -> SimpleNamespace:
    """The parts of a `SpeculatorClient` its `_wait_drafts` reads."""
    return SimpleNamespace(
        config=SimpleNamespace(speculator_timeout=timeout),
        supervisor=SimpleNamespace(process=process),
        step_id=7,
    )


def test_a_busy_speculator_is_waited_for_past_the_timeout(child) -> None:
    start = time.monotonic()
    got = SpeculatorClient._wait_drafts(_waiter(child), LateLink(REPLY_AFTER_S))
    assert got == ("drafts", 7)
    assert time.monotonic() - start >= REPLY_AFTER_S


def test_a_stopped_speculator_is_a_fault_after_one_timeout(child) -> None:
    child.proc.send_signal(signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(TransportError, match="without speculator progress"):
        SpeculatorClient._wait_drafts(_waiter(child), LateLink(REPLY_AFTER_S))
    assert TIMEOUT_S <= time.monotonic() - start < REPLY_AFTER_S
    child.proc.send_signal(signal.SIGCONT)


def test_a_busy_speculator_is_a_fault_after_the_hard_limit(child, monkeypatch) -> None:
    monkeypatch.setattr(speculator_client, "HARD_TIMEOUT_FACTOR", 2)
    start = time.monotonic()
    with pytest.raises(TransportError, match=r"2 x 0\.6 s"):
        SpeculatorClient._wait_drafts(_waiter(child), LateLink(REPLY_AFTER_S))
    assert 2 * TIMEOUT_S <= time.monotonic() - start < REPLY_AFTER_S


def test_a_process_that_exits_is_found_at_once(child) -> None:
    child.proc.kill()
    child.proc.wait(10)
    with pytest.raises(TransportError, match="exited"):
        SpeculatorClient._wait_drafts(_waiter(child), LateLink(REPLY_AFTER_S))
    assert child.cpu_seconds() is None

"""The start-up wait counts the speculator's whole process tree as progress: a speculator whose
warm-up waits for a busy child (as for the `nvcc` a first FlashInfer plan starts on CUDA) for
longer than the no-progress limit is waited for, not killed and restarted; and the speculator
warms up at its serving shapes before it links, naming the warm-up's seconds in its ready line."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from sglang_ssd.config import SSDConfig
from sglang_ssd.launch.placement import Placement
from sglang_ssd.speculator.warmup import BUSY_CHILD_ENV
from sglang_ssd.testing.tiny_models import make_tiny_model
from sglang_ssd.worker import supervisor
from sglang_ssd.worker.supervisor import SpeculatorProcess, Supervisor

STALL_S = 1.5  # the start-up's no-progress limit in these tests (120 s when serving)
CHILD_S = 3 * STALL_S  # the warm-up's busy child outlasts it


def test_cpu_seconds_count_a_busy_grandchild() -> None:
    """The process itself sleeps in `wait`; its child's child spins: that is progress."""
    spin = "while True: pass"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"
    process = SpeculatorProcess.__new__(SpeculatorProcess)
    process.proc = subprocess.Popen([sys.executable, "-c", code])
    root = psutil.Process(process.pid)
    try:
        deadline = time.monotonic() + 30
        while not root.children(recursive=True) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the parent has started waiting
        own, before = sum(root.cpu_times()[:2]), process.cpu_seconds()
        assert before is not None
        while (process.cpu_seconds() or 0.0) - before < 0.3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (process.cpu_seconds() or 0.0) - before >= 0.3
        assert sum(root.cpu_times()[:2]) - own < 0.1  # not the process's own CPU
    finally:
        process.kill()
    assert process.cpu_seconds() is None


def test_a_warm_up_busy_in_a_child_is_waited_for_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(supervisor, "STARTUP_STALL_S", STALL_S)
    monkeypatch.setenv(BUSY_CHILD_ENV, str(CHILD_S))
    monkeypatch.delenv("SGLANG_SSD_SPECULATOR_ZYGOTE", raising=False)
    draft = make_tiny_model(tmp_path / "draft")
    sup = Supervisor(
        lambda: SSDConfig(draft_kv_tokens=512, draft_vocab=0),
        str(draft),
        Placement("cpu", None),
        threading.Lock(),
        lambda: None,
        target_vocab_size=128,
    )
    start = time.monotonic()
    try:
        sup.start()
        elapsed = time.monotonic() - start
        assert sup.link is not None and sup.process is not None and sup.process.alive()
        assert sup.faults == 0 and sup.restarts == 0
        assert elapsed >= CHILD_S
    finally:
        sup.stop()
    err = capfd.readouterr().err
    assert "waiting for a busy child" in err
    ready = [line for line in err.splitlines() if "speculator ready:" in line]
    assert len(ready) == 1 and ready[0].rstrip().endswith(" s"), ready
    assert "warm-up " in ready[0]


def test_a_stalled_start_is_a_transport_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A speculator that never links and uses no CPU (stopped) fails the start after the
    no-progress limit, and nothing is left running."""
    monkeypatch.setattr(supervisor, "STARTUP_STALL_S", STALL_S)
    started: list[SpeculatorProcess] = []

    def stopped(self, args, env):  # a process that sleeps forever instead of the speculator
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        started.append(self)
        return proc

    monkeypatch.setattr(SpeculatorProcess, "_start", stopped)
    sup = Supervisor(SSDConfig, "draft", Placement("cpu", None), threading.Lock(), lambda: None)
    with pytest.raises(supervisor.TransportError, match="no progress for"):
        sup.start()
    assert len(started) == 1 and not started[0].alive()

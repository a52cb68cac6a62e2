"""RoundTimer: per-round totals and the per-source acceptance the speedup model needs;
RoundClock: one round's phases and the scheduler's time between rounds."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.worker import metrics
from sglang_ssd.worker.metrics import RoundClock, RoundTimer


def test_round_timer_splits_acceptance_by_draft_source() -> None:
    timer = RoundTimer()
    timer.record(2, {"forward": 0.4, "wait_draft": 0.1}, torch.tensor([4, 1]), ["cache", "jit"])
    timer.record(1, {"forward": 0.4, "wait_draft": 0.3}, torch.tensor([2]), ["cache"])
    out = timer.snapshot().summary()
    assert out["rounds"] == 2 and out["request_rounds"] == 3
    assert out["accept_length"] == pytest.approx(1 + 7 / 3)
    assert out["cache_hit_rate"] == pytest.approx(2 / 3)
    assert out["rounds_by_source"] == {"cache": 2, "jit": 1}
    assert out["accepted_by_source"] == {"cache": 6, "jit": 1}
    assert out["avg_wait_draft_s"] == pytest.approx(0.2)
    assert out["target_phases"] == pytest.approx({"forward": 0.4, "wait_draft": 0.2})


def test_a_window_is_the_difference_of_two_snapshots() -> None:
    timer = RoundTimer()
    timer.record(2, {"forward": 0.4, "wait_draft": 0.1}, torch.tensor([4, 1]), ["cache", "jit"])
    before = timer.snapshot()
    phases = {"build_batch": 0.0, "forward": 0.2, "wait_draft": 0.3, "verify": 0.05}
    timer.record(1, phases, torch.tensor([2]), ["cache"])
    window = timer.snapshot() - before
    assert (window.rounds, window.requests, window.accepted, window.hits) == (1, 1, 2, 1)
    assert window.sources == {"cache": 1, "jit": 0}
    assert window.accepted_by_source == {"cache": 2, "jit": 0}
    assert window.phases == pytest.approx(phases)
    assert (window.wait_draft_s, window.forward_s, window.verify_s) == pytest.approx(
        (0.3, 0.2, 0.25)  # the per-round figures are sums of the round's phases
    )
    assert window.target_busy_s == pytest.approx(0.25)  # waiting for drafts left out
    assert before.rounds == 1  # a snapshot does not move with the timer


def test_round_timer_rejects_mismatched_sources() -> None:
    with pytest.raises(ValueError):
        RoundTimer().record(2, {}, torch.tensor([1, 2]), ["cache"])


def test_round_clock_opens_each_round_with_the_scheduler_gap(monkeypatch) -> None:
    clock_now = iter([10.0, 10.5, 11.0, 13.0, 13.25, 20.0, 21.0, 21.5])
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock_now))
    clock = RoundClock()
    phases = clock.start()  # 10.0: the first round has no gap
    phases.add("forward", 0.4)
    assert clock.spent(("forward", "verify")) == pytest.approx(0.4)
    assert clock.round_s() == pytest.approx(0.5)  # 10.5
    assert clock.stop() == {"forward": 0.4}  # ends at 11.0
    phases = clock.start()  # 13.0: two seconds of scheduler time since the round ended
    assert phases.seconds == {"scheduler": pytest.approx(2.0)}
    assert clock.round_s() == pytest.approx(0.25 + 2.0)  # 13.25, the gap included
    clock.stop()  # 20.0
    clock.prefill()
    assert "scheduler" not in clock.start().seconds  # 21.0: the prefill's time is its own
    assert clock.round_s() == pytest.approx(0.5)  # 21.5: and no earlier round's gap either

"""RoundClock on a device: one round in `sample_every` synchronises at every phase boundary, the
others once at the round's end, with their round time exact and their device phases split as in
the latest sampled round (the policies and the decode log read these phases)."""

from __future__ import annotations

import pytest

from sglang_ssd.worker import metrics
from sglang_ssd.worker.metrics import RoundClock


def _round(clock: RoundClock, forward_s: float, verify_s: float, wait_s: float = 0.1) -> dict:
    phases = clock.start()
    phases.add("wait_draft", wait_s)
    with phases.phase("forward"):
        pass
    with phases.phase("verify"):
        pass
    phases.seconds["forward"], phases.seconds["verify"] = forward_s, verify_s
    return clock.stop()


def test_only_sampled_rounds_sync_between_phases() -> None:
    syncs: list[int] = []
    clock = RoundClock(sample_every=4, sync=lambda: syncs.append(clock.rounds))
    for _ in range(8):
        _round(clock, 0.3, 0.1)
    per_round = [syncs.count(r) for r in range(1, 9)]
    assert per_round == [4, 1, 1, 1, 4, 1, 1, 1]  # two phases x (start, end) or the end sync


def test_an_unsampled_round_splits_its_synced_time_as_the_sampled_one(monkeypatch) -> None:
    now = iter([0.0, 0.5, 10.0, 11.0])  # round 1: 0.0 to 0.5; round 2: 10.0 to 11.0
    clock = RoundClock(sample_every=8, sync=lambda: None)
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(now, 0.0))
    phases = clock.start()
    phases.seconds.update(wait_draft=0.1, forward=0.3, verify=0.1)
    assert clock.spent(("forward",)) == pytest.approx(0.3)
    assert clock.stop() == pytest.approx({"wait_draft": 0.1, "forward": 0.3, "verify": 0.1})
    phases = clock.start()
    assert not clock.sampled
    # Host times without syncs: launches only; the device work shows up at the end sync.
    phases.seconds.update(wait_draft=0.2, forward=0.01, verify=0.7)
    assert clock.spent(("forward",)) == 0.0  # not measured on this round
    out = clock.stop()
    busy = 11.0 - 10.0 - 0.2  # the round's time less the host-timed wait
    expected = {"wait_draft": 0.2, "forward": 0.75 * busy, "verify": 0.25 * busy, "scheduler": 9.5}
    assert out == pytest.approx(expected)


def test_on_the_cpu_every_round_is_sampled_and_sync_free() -> None:
    clock = RoundClock("cpu")
    for _ in range(3):
        _round(clock, 0.3, 0.1)
        assert clock.sampled and clock.sync is None
    with pytest.raises(ValueError, match="sample_every"):
        RoundClock(sample_every=0)

"""RoundTimer: per-round totals and the per-source acceptance the speedup model needs."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.worker.metrics import RoundTimer


def test_round_timer_splits_acceptance_by_draft_source() -> None:
    timer = RoundTimer()
    timer.record(2, 0.1, 0.5, 0.4, torch.tensor([4, 1]), ["cache", "jit"])
    timer.record(1, 0.3, 0.5, 0.4, torch.tensor([2]), ["cache"])
    out = timer.summary()
    assert out["rounds"] == 2 and out["request_rounds"] == 3
    assert out["accept_length"] == pytest.approx(1 + 7 / 3)
    assert out["cache_hit_rate"] == pytest.approx(2 / 3)
    assert out["source_cache"] == 2 and out["source_jit"] == 1
    assert out["accepted_cache"] == 6 and out["accepted_jit"] == 1
    assert out["avg_wait_draft_s"] == pytest.approx(0.2)


def test_round_timer_rejects_mismatched_sources() -> None:
    with pytest.raises(ValueError):
        RoundTimer().record(2, 0.0, 0.0, 0.0, torch.tensor([1, 2]), ["cache"])

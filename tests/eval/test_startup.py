"""`eval.startup`: the start-up benchmark's order of arms (its servers are the bench itself)."""

from __future__ import annotations

from eval.startup import ARMS, order


def test_arms_alternate_a_b_c_c_b_a_so_drift_cancels() -> None:
    assert order(2) == ["forkserver", "spawn", "zygote", "zygote", "spawn", "forkserver"]
    runs = order(3)
    assert len(runs) == 9 and all(runs.count(arm) == 3 for arm in ARMS)

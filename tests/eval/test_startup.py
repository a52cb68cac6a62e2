"""`eval.startup`: the start-up benchmark's order of arms (its servers are the bench itself)."""

from __future__ import annotations

from eval.startup import ARMS, order
from sglang_ssd.launch import zygote
from sglang_ssd.launch.fork_start import SWITCH


def test_arms_alternate_a_b_c_c_b_a_so_drift_cancels() -> None:
    arms = list(ARMS)
    assert order(2) == arms + arms[::-1]
    runs = order(3)
    assert len(runs) == 3 * len(arms) and all(runs.count(arm) == 3 for arm in ARMS)


def test_arms_separate_each_start_up_path() -> None:
    """Each path the launcher can take is one arm, switched by the environment it reads."""
    envs = {arm: ARMS[arm].env() for arm in ARMS}
    assert envs["spawn"] == {SWITCH: "0", zygote.SPECULATOR_SWITCH: "0"}
    assert envs["forkserver+spec"] == {SWITCH: "1", zygote.SPECULATOR_SWITCH: "1"}
    assert [arm for arm in ARMS if ARMS[arm].forked] == ["zygote", "zygote+spec"]

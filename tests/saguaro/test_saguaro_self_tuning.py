"""`DepthTuner`: the tree depth D that the verify can hide, from live phases and acceptance."""

from __future__ import annotations

import pytest

from sglang_ssd.saguaro import expected_speedup
from sglang_ssd.saguaro.self_tuning import SWITCH_MARGIN, DepthTuner

GAMMA = 4


def _build_phases(per_forward: float, depth: int, populate: float = 0.002) -> dict[str, float]:
    """A build's phases as the speculator reports them: glue + `depth` tree forwards, each
    split 80/15/5 into body, LM head and sampling."""
    body, head, sampling = 0.8 * per_forward, 0.15 * per_forward, 0.05 * per_forward
    phases = {"glue": body, "lm_head": head * (1 + depth), "sampling": sampling * depth}
    phases.update({f"tree_{d}": body for d in range(1, depth + 1)})
    phases.update(populate=populate, jit=0.0, send=0.001)
    return phases


def _choose(tuner: DepthTuner, t_verify: float, p_hit: float = 0.8, batch: int = 1) -> int:
    return tuner.choose(
        t_verify=t_verify, p_hit=p_hit, alpha_miss=0.3, t_backup=0.002, batch_size=batch
    )


def test_slow_forwards_give_a_shallow_tree_fast_ones_the_full_depth() -> None:
    slow = DepthTuner(GAMMA)
    slow.observe_build(_build_phases(0.155, depth=GAMMA), GAMMA)
    assert slow.t_forward == pytest.approx(0.155 * (1 + GAMMA - 0.05) / (1 + GAMMA), rel=1e-6)
    # 5 forwards of 0.155 s against a 0.45 s verify: T_p ≈ 1.7. D = 2 is 3 forwards ≈ 1.0.
    assert _choose(slow, t_verify=0.45) == 2
    fast = DepthTuner(GAMMA)
    fast.observe_build(_build_phases(0.05, depth=GAMMA), GAMMA)
    assert _choose(fast, t_verify=0.45) == GAMMA


def test_choice_is_the_model_argmax_and_keeps_the_current_depth_within_the_margin() -> None:
    tuner = DepthTuner(GAMMA)
    tuner.observe_build(_build_phases(0.12, depth=GAMMA), GAMMA)
    kwargs = dict(t_verify=0.45, p_hit=0.7, alpha_miss=0.3, t_backup=0.002, batch_size=1)
    speeds = {d: tuner.speed(d, **kwargs) for d in range(1, GAMMA + 1)}
    best = max(speeds, key=speeds.get)
    assert tuner.choose(**kwargs) == best
    # The speed is expected_speedup with the hit lookahead D and the modelled build time.
    assert speeds[best] == pytest.approx(
        expected_speedup(
            alpha_hit=tuner.alpha,
            alpha_miss=0.3,
            lookahead=GAMMA,
            hit_lookahead=best,
            p_hit=0.7,
            t_spec=tuner.build_time(best) / 0.45,
            t_backup=0.002 / 0.45,
        )
    )
    # From any other depth it switches only when the best is SWITCH_MARGIN faster.
    for current in speeds:
        tuner.depth = current
        expect = best if speeds[best] > SWITCH_MARGIN * speeds[current] else current
        assert tuner.choose(**kwargs) == expect


def test_pinned_depth_and_no_build_yet_keep_the_depth() -> None:
    pinned = DepthTuner(GAMMA, pinned=3)
    pinned.observe_build(_build_phases(0.5, depth=3), 3)
    assert _choose(pinned, t_verify=0.1) == 3
    assert pinned.stats()["tree_depth_pinned"] == 1.0
    fresh = DepthTuner(GAMMA)
    assert _choose(fresh, t_verify=0.45) == GAMMA  # nothing timed yet: γ
    fresh.pin(2)
    assert fresh.depth == 2 and fresh.stats()["tree_depth"] == 2.0
    fresh.pin(None)
    assert fresh.pinned is None and fresh.depth == 2  # self-tunes again from where it was
    with pytest.raises(ValueError, match=r"1\.\.γ=4"):
        fresh.pin(5)


def test_a_step_without_a_build_is_not_a_timing() -> None:
    tuner = DepthTuner(GAMMA)
    tuner.observe_build({"jit": 0.5, "lookup": 0.001, "send": 0.001}, GAMMA)
    tuner.observe_build(_build_phases(0.1, depth=2), 0)
    assert tuner.t_forward is None


def test_alpha_pools_hits_of_different_depths_as_a_truncated_geometric() -> None:
    tuner = DepthTuner(GAMMA, accepted=0.0, tried=0.0)
    # depth 2: k=2 (2 tried, all accepted); depth 4: k=1 (2 tried, 1 accepted); k=0 (1 tried)
    tuner.observe_hits([2, 1, 0], [2, 4, 4])
    assert tuner.alpha == pytest.approx(3 / 5)
    tuner.observe_hits([9], [4])  # k > depth: not a valid hit, ignored
    assert tuner.alpha == pytest.approx(3 / 5)


def test_more_acceptance_makes_depth_worth_more() -> None:
    low = DepthTuner(GAMMA, accepted=1.0, tried=3.0)
    high = DepthTuner(GAMMA, accepted=19.0, tried=20.0)
    for tuner in (low, high):
        tuner.observe_build(_build_phases(0.12, depth=GAMMA), GAMMA)
    assert _choose(low, t_verify=0.45) <= _choose(high, t_verify=0.45)
    assert _choose(low, t_verify=0.45) < GAMMA


def test_just_in_time_forwards_in_the_same_step_do_not_inflate_the_build_forward() -> None:
    """A miss round's jit forwards record their LM head and sampling in the same phases as the
    build's: they are shared out by body time, so t_forward stays the build's own."""
    alone, with_jit = DepthTuner(GAMMA), DepthTuner(GAMMA)
    alone.observe_build(_build_phases(0.155, depth=2), 2)
    phases = _build_phases(0.155, depth=2)
    jit = _build_phases(0.155, depth=3)  # 4 more forwards of the same cost, as jit recorded them
    phases["jit"] = jit["glue"] + sum(jit[f"tree_{d}"] for d in range(1, 4))
    phases["lm_head"] += jit["lm_head"]
    phases["sampling"] += jit["sampling"]
    with_jit.observe_build(phases, 2)
    assert with_jit.t_forward == pytest.approx(alone.t_forward, rel=0.02)

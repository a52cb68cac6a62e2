"""`DepthTuner`: the tree depth D that the verify can hide, from live phases and acceptance."""

from __future__ import annotations

import pytest

from sglang_ssd.saguaro import AcceptanceCounts, expected_speedup
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
    slow.observe_build(_build_phases(0.155, depth=GAMMA), 1 + GAMMA, 1 + GAMMA)
    assert slow.t_forward == pytest.approx(0.155 * (1 + GAMMA - 0.05) / (1 + GAMMA), rel=1e-6)
    # 5 forwards of 0.155 s against a 0.45 s verify: T_p ≈ 1.7. D = 2 is 3 forwards ≈ 1.0.
    assert _choose(slow, t_verify=0.45) == 2
    fast = DepthTuner(GAMMA)
    fast.observe_build(_build_phases(0.05, depth=GAMMA), 1 + GAMMA, 1 + GAMMA)
    assert _choose(fast, t_verify=0.45) == GAMMA


def test_choice_is_the_model_argmax_and_keeps_the_current_depth_within_the_margin() -> None:
    tuner = DepthTuner(GAMMA)
    tuner.observe_build(_build_phases(0.12, depth=GAMMA), 1 + GAMMA, 1 + GAMMA)
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
    pinned.observe_build(_build_phases(0.5, depth=3), 4, 4)
    assert _choose(pinned, t_verify=0.1) == 3
    assert pinned.stats()["tree_depth_pinned"] == 1.0
    fresh = DepthTuner(GAMMA)
    assert _choose(fresh, t_verify=0.45) == GAMMA  # nothing timed yet: γ
    fresh.pin(2)
    assert fresh.depth == 2 and fresh.stats()["tree_depth"] == 2.0
    fresh.pin(0)  # 0 (or None): self-tune again, from where it was
    assert fresh.pinned is None and fresh.depth == 2
    with pytest.raises(ValueError, match=r"1\.\.γ=4"):
        fresh.pin(5)


def test_a_step_without_a_build_is_not_a_timing() -> None:
    tuner = DepthTuner(GAMMA)
    tuner.observe_build({"jit": 0.5, "lm_head": 0.1, "send": 0.001}, forwards=4, build_forwards=0)
    assert tuner.t_forward is None


def test_alpha_pools_hits_of_different_depths_as_a_truncated_geometric() -> None:
    tuner = DepthTuner(GAMMA, acceptance=AcceptanceCounts(0.0, 0.0))
    # depth 2: k=2 (2 tried, all accepted); depth 4: k=1 (2 tried, 1 accepted); k=0 (1 tried)
    tuner.observe_hits([2, 1, 0], [2, 4, 4])
    assert tuner.alpha == pytest.approx(3 / 5)
    tuner.observe_hits([9], [4])  # k > depth: not a valid hit, ignored
    assert tuner.alpha == pytest.approx(3 / 5)


def test_more_acceptance_makes_depth_worth_more() -> None:
    low = DepthTuner(GAMMA, acceptance=AcceptanceCounts(1.0, 3.0))
    high = DepthTuner(GAMMA, acceptance=AcceptanceCounts(19.0, 20.0))
    for tuner in (low, high):
        tuner.observe_build(_build_phases(0.12, depth=GAMMA), 1 + GAMMA, 1 + GAMMA)
    assert _choose(low, t_verify=0.45) <= _choose(high, t_verify=0.45)
    assert _choose(low, t_verify=0.45) < GAMMA


def test_other_forwards_and_extra_builds_in_one_reply_are_divided_out() -> None:
    """A reply can hold a miss round's jit forwards (their LM head and sampling land in the same
    phases) and a first-round build next to the Step's own: t_forward divides the build bodies
    by the build forwards and the per-forward head by all forwards."""
    alone, busy = DepthTuner(GAMMA), DepthTuner(GAMMA)
    alone.observe_build(_build_phases(0.155, depth=2), 3, 3)
    two_builds = _build_phases(0.155, depth=2)
    for name in ("glue", "tree_1", "tree_2", "lm_head", "sampling"):
        two_builds[name] *= 2
    jit = _build_phases(0.155, depth=3)  # 4 jit forwards of the same cost
    two_builds["jit"] = jit["glue"] + sum(jit[f"tree_{d}"] for d in range(1, 4))
    two_builds["lm_head"] += jit["lm_head"]
    two_builds["sampling"] += jit["sampling"]
    busy.observe_build(two_builds, forwards=3 + 3 + 4, build_forwards=6)
    assert busy.t_forward == pytest.approx(alone.t_forward, rel=0.03)

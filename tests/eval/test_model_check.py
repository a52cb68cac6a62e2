"""The speedup model from component counters (`eval.model_check`).

A synthetic run is written the way the harness writes one (per-batch `/ssd/stats` deltas with
the speculator's cumulative counters) from known components; `components` must recover them and
`predict` / `check` must rate other budgets, depths and runs from them alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from eval import model_check
from eval.configs import Config
from sglang_ssd.saguaro import expected_accept_length, expected_speedup, geometric_fanout

T_FORWARD, T_FIXED, T_VERIFY, C, R = 0.05, 0.02, 0.4, 0.6, 0.8


def _ssd_delta(depth: int, budget: int, rounds: int, batch: int) -> dict[str, float]:
    alpha = 0.7
    req_rounds = rounds * batch
    hits = int(0.8 * req_rounds)
    out = {
        "rounds": float(rounds),
        "request_rounds": float(req_rounds),
        "wait_draft_s": 0.01 * rounds,
        "rounds_cache": float(hits),
        "rounds_jit": float(req_rounds - hits),
        "accepted_cache": hits * (expected_accept_length(alpha, depth) - 1),
        "accepted_jit": 0.5 * (req_rounds - hits),
        "speculator_steps": float(rounds),
        "speculator_build_s": rounds * (T_FIXED + (1 + depth) * T_FORWARD),
        "speculator_backup_s": 0.03 * (req_rounds - hits),
        f"speculator_builds_at_depth_{depth}": float(rounds),
        # Forwards of builds, plus one just-in-time forward per miss: bodies only in builds.
        "speculator_build_draft_forwards": float(rounds * (1 + depth)),
        "speculator_draft_forwards": float(rounds * (1 + depth) + req_rounds - hits),
        "speculator_phase_s_glue": rounds * 0.6 * T_FORWARD,
        "speculator_phase_s_lm_head": (rounds * (1 + depth) + req_rounds - hits) * 0.4 * T_FORWARD,
    }
    for d in range(1, depth + 1):
        out[f"speculator_phase_s_tree_{d}"] = rounds * 0.6 * T_FORWARD
    for f in sorted(set(geometric_fanout(budget, depth, alpha, R, 1 << 16)) - {0}):
        n = 4000.0
        out[f"speculator_fanout_outcomes_{f}"] = n
        out[f"speculator_fanout_hits_{f}"] = n * (1 - C * f**-R)
    return out


def _results(depth: int | None, budget: int, batch: int = 1, ar_tok_s: float = 4.0,
             ssd_tok_s: float = 6.0, temperature: float = 0.0) -> dict[str, Any]:  # fmt: skip
    args = ["--speculative-algorithm", "SSD", "--ssd-mode", "async", "--ssd-fanout-budget",
            str(budget)]  # fmt: skip
    if depth is not None:
        args += ["--ssd-tree-depth", str(depth)]
    configs = [Config("AR-2c", ("--speculative-algorithm", "NONE")), Config("SSD", tuple(args)),
               Config("SYNC", (*args[:2], "--ssd-mode", "sync", *args[4:]))]  # fmt: skip
    wall = 100 * (T_VERIFY + 0.01)
    ssd = _ssd_delta(depth or 4, budget, 100, batch)
    return {
        "settings": {"batch_size": batch, "sampling": {"temperature": temperature}},
        "configs": [c.to_dict() for c in configs],
        "batches": [
            {"config": "AR-2c", "wall_s": 10.0},
            {"config": "SSD", "wall_s": wall, "ssd": ssd},
            {"config": "SYNC", "wall_s": wall, "ssd": ssd},
        ],
        "summary": {
            "configs": {
                "AR-2c": {"tok_per_s": ar_tok_s},
                "SSD": {"tok_per_s": ssd_tok_s},
                "SYNC": {"tok_per_s": 3.0},
            }
        },
    }


def test_components_recover_what_the_run_measured() -> None:
    comp = model_check.components(_results(4, 16), "SSD")
    assert (comp.batch_size, comp.lookahead, comp.depth, comp.budget) == (1, 4, 4, 16)
    assert comp.t_forward == pytest.approx(T_FORWARD)
    assert comp.t_fixed == pytest.approx(T_FIXED)
    assert comp.build_time(2) == pytest.approx(T_FIXED + 3 * T_FORWARD)
    assert comp.t_verify == pytest.approx(T_VERIFY)
    assert comp.t_ar == pytest.approx(1 / 4.0)
    assert comp.alpha == pytest.approx(0.7, abs=1e-6)
    assert comp.hit_c == pytest.approx(C, rel=0.02) and comp.hit_r == pytest.approx(R, rel=0.02)
    assert comp.t_backup == pytest.approx(0.03)
    assert 0 < comp.coverage <= 1


def test_prediction_rates_other_budgets_and_depths_from_the_components() -> None:
    comp = model_check.components(_results(4, 16), "SSD")
    got = model_check.predict(comp, budget=8, depth=2)
    p_hit = comp.p_hit_at(8, 2)
    want = expected_speedup(
        alpha_hit=comp.alpha, alpha_miss=comp.alpha_miss, lookahead=4, hit_lookahead=2,
        p_hit=p_hit, t_spec=(T_FIXED + 3 * T_FORWARD) / T_VERIFY, t_backup=0.03 / T_VERIFY,
        batch_size=1, t_ar_over_t_verify=0.25 / T_VERIFY,
    )  # fmt: skip
    assert got["speedup"] == pytest.approx(want) and got["p_hit"] == pytest.approx(p_hit)
    # A bigger budget caches more outcomes; the hit rate is a probability.
    assert 0 < comp.p_hit_at(4, 2) < comp.p_hit_at(8, 2) < comp.p_hit_at(64, 2) <= 1
    # Self-tuned: the fastest depth by the model, with every depth's rating kept.
    tuned = model_check.predict(comp, budget=8)
    assert tuned["self_tuned"] and tuned["speedup"] == max(tuned["by_depth"].values())
    assert tuned["by_depth"][str(tuned["depth"])] == tuned["speedup"]


def test_a_slower_build_or_batch_mates_cost_speed() -> None:
    fast = model_check.components(_results(4, 16), "SSD")
    slow = model_check.components(_results(4, 16), "SSD")
    object.__setattr__(slow, "t_forward", 4 * T_FORWARD)  # T_p(4) now > T_v
    assert model_check.predict(slow, 8, 4)["speedup"] < model_check.predict(fast, 8, 4)["speedup"]
    b4 = model_check.components(_results(4, 16, batch=4), "SSD")
    # Same components per request, but a round waits for all four to hit: slower per request.
    assert b4.t_ar == pytest.approx(4 / 4.0)
    one = model_check.predict(fast, 8, 4)["speedup"]
    assert model_check.predict(b4, 8, 4)["speedup"] < one * 4


def test_check_compares_each_async_ssd_row_of_another_run() -> None:
    comp = model_check.components(_results(4, 16), "SSD")
    target = _results(None, 8, ssd_tok_s=6.0)
    (row,) = model_check.check(comp, target)  # the sync configuration is not rated
    assert row["config"] == "SSD" and row["self_tuned"] and row["budget"] == 8
    assert row["measured"] == pytest.approx(1.5)
    assert row["error"] == pytest.approx(row["speedup"] / 1.5 - 1)
    assert row["within"] == (abs(row["error"]) <= model_check.AIM)
    # Absolute speed: the prediction times the components run's AR (4 tok/s here).
    assert row["predicted_tok_per_s"] == pytest.approx(row["speedup"] * 4.0)
    assert row["tok_per_s_error"] == pytest.approx(row["predicted_tok_per_s"] / 6.0 - 1)
    b4 = model_check.components(_results(4, 16, batch=4), "SSD")
    (row4,) = model_check.check(b4, _results(None, 8, batch=4))
    assert row4["predicted_tok_per_s"] == pytest.approx(row4["speedup"] * 4.0)  # all 4 requests
    assert "model picks D=" in model_check.report(comp, [row])
    with pytest.raises(ValueError, match="same b"):
        model_check.check(comp, _results(None, 8, batch=4))
    with pytest.raises(ValueError, match="temperature"):  # α differs when sampling
        model_check.check(comp, _results(None, 8, temperature=0.7))


def test_components_need_the_counters() -> None:
    old = _results(4, 16)
    old["batches"][1]["ssd"] = {
        k: v for k, v in old["batches"][1]["ssd"].items() if not k.startswith("speculator_fan")
    }
    with pytest.raises(ValueError):
        model_check.components(old, "SSD")
    with pytest.raises(ValueError, match="must both be"):
        model_check.components(old, "nope")


def test_hit_rate_weighs_each_accept_length_and_is_stationary() -> None:
    comp = model_check.components(_results(4, 16), "SSD")
    h = [1 - comp.hit_c * f**-comp.hit_r for f in (1, 2, 4)]
    # k = 0, 1 of a 2-token draft are rejections (α^k (1 - α)), k = 2 accepts all (α^2).
    want = 0.5 * h[0] + 0.25 * h[1] + 0.25 * h[2]
    assert comp.hit_after(0.5, 2, [1, 2, 4]) == pytest.approx(want)
    assert comp.hit_after(0.5, 2, [0, 2, 4]) == pytest.approx(want - 0.5 * h[0])  # F = 0 misses
    after_hit = comp.hit_after(
        comp.alpha, 2, geometric_fanout(8, 2, comp.alpha, comp.hit_r, 1 << 16)
    )
    after_miss = comp.hit_after(
        comp.alpha_miss, 4, geometric_fanout(8, 4, comp.alpha, comp.hit_r, 1 << 16)
    )
    # p = p·h + (1 - p)·m: a hit's tree hangs off a D-token draft, a miss's off the backup's.
    p = after_miss / (1 - after_hit + after_miss)
    assert comp.p_hit_at(8, 2) == pytest.approx(comp.coverage * p)

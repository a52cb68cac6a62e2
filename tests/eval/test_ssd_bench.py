"""The SSD benchmark: arrangements, SSD's counters around a batch, the speedup model's prediction.

The live test runs the session's shared tiny AR and SSD servers through the harness and checks
that each SSD batch carries its `/ssd/stats` delta (rounds, cache hits) and that the summary and the
comparison table derive the hit rate and a prediction from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny_servers import provider, restore_live_settings

from eval import configs, datasets, harness, ssd_bench, ssd_stats
from eval.sampling import Sampling
from eval.servers import Server
from sglang_ssd.launch_server import flag_value
from sglang_ssd.saguaro import expected_speedup


def _stats(rounds: int, hits: int, misses: int, acc_hit: int, acc_miss: int) -> dict[str, Any]:
    return {
        "rounds": rounds,
        "request_rounds": hits + misses,
        "avg_verify_s": 0.5,
        "avg_wait_draft_s": 0.1,
        "avg_forward_s": 0.4,
        "rounds_by_source": {"cache": hits, "jit": misses},
        "accepted_by_source": {"cache": acc_hit, "jit": acc_miss},
        "speculator": {"steps": rounds, "build_s": 0.6 * rounds, "backup_s": 0.2 * misses},
    }


def test_totals_delta_and_measured_quantities() -> None:
    before = ssd_stats.totals(_stats(10, 8, 2, 24, 2))
    after = ssd_stats.totals(_stats(30, 26, 4, 78, 4))
    d = ssd_stats.delta(before, after)
    assert d["rounds"] == 20 and d["rounds_cache"] == 18 and d["accepted_cache"] == 54
    assert d["verify_s"] == pytest.approx(10.0)
    m = ssd_stats.measured(ssd_stats.add([d]), wall_s=12.0)
    assert m["p_hit"] == pytest.approx(18 / 20)
    assert m["accept_length_hit"] == pytest.approx(1 + 54 / 18)
    assert m["accept_length_miss"] == pytest.approx(1 + 2 / 2)
    assert m["round_s"] == pytest.approx(0.6) and m["target_s"] == pytest.approx(0.5)
    assert m["t_spec"] == pytest.approx(0.6 / 0.5)
    assert m["t_backup"] == pytest.approx(0.2 / 0.5)
    assert ssd_stats.measured({"rounds": 0.0}, 1.0) == {"rounds": 0.0}


def test_prediction_is_the_speedup_model() -> None:
    m = {"p_hit": 0.9, "accept_length": 3.5, "accept_length_hit": 4.0, "accept_length_miss": 2.0,
         "target_s": 0.5, "t_spec": 1.2, "t_backup": 0.4}  # fmt: skip
    got = ssd_stats.predict(m, lookahead=4, batch_size=1, ar_tok_per_s=4.0)
    from sglang_ssd.saguaro import alpha_from_accept_length as alpha

    want = expected_speedup(alpha(4.0, 4), alpha(2.0, 4), 4, 0.9, 1.2, 0.4, 1, 0.25 / 0.5)
    assert got == pytest.approx(want)
    # sync: no pre-speculation cost, every round pays the backup
    sync = ssd_stats.predict(m | {"p_hit": 0.0}, 4, 1, 4.0, async_mode=False)
    assert sync == pytest.approx(expected_speedup(0.0, alpha(2.0, 4), 4, 0.0, 0.0, 0.4, 1, 0.5))
    assert ssd_stats.predict({"p_hit": None}, 4, 1, 4.0) is None


def test_bench_configs_arrangements() -> None:
    cfgs = ssd_bench.bench_configs("T", "D")
    names = [c.name for c in cfgs]
    assert names == ["AR-1c", "STANDALONE-1c", "SYNC-1c", "AR-2c", "STANDALONE-2c", "SYNC-2c",
                     "SSD-1+1c", "SSD-auto"]  # fmt: skip
    by = {c.name: c for c in cfgs}
    assert by["AR-1c"].cpus == (0,) and by["STANDALONE-2c"].cpus == (0, 1)
    assert flag_value(by["SSD-1+1c"].args, "--ssd-draft-cpus") == "1"
    assert flag_value(by["SYNC-1c"].args, "--ssd-mode") == "sync"
    assert flag_value(by["SYNC-1c"].args, "--ssd-draft-cpus") is None  # shares core 0
    assert flag_value(by["SYNC-2c"].args, "--ssd-draft-cpus") == "0,1"  # both cores, in turn
    assert flag_value(by["SSD-1+1c"].args, "--ssd-mode") == "async"
    assert flag_value(by["SSD-auto"].args, "--ssd-mode") == "auto"  # the default, same cores
    assert by["SSD-auto"].cpus == (0, 1)
    assert flag_value(by["SSD-auto"].args, "--ssd-draft-cpus") == "1"
    assert ssd_bench.setting_kind(4, True) == "b4-greedy"
    assert {c.lookahead for c in cfgs if c.algorithm != "NONE"} == {4}
    assert [c.name for c in ssd_bench.bench_configs("T", "D", ["paper"])][-1] == "SSD-1+1c"
    # --only: a subset in the order given, the first the reference
    picked = ssd_bench.select(cfgs, ["AR-2c", "SYNC-2c", "SSD-1+1c"])
    assert [c.name for c in picked] == ["AR-2c", "SYNC-2c", "SSD-1+1c"]
    with pytest.raises(ValueError, match="AR-3c"):
        ssd_bench.select(cfgs, ["AR-3c"])
    with pytest.raises(ValueError):
        ssd_bench.bench_configs("T", "D", ["nope"])
    with pytest.raises(ValueError):
        ssd_bench.bench_configs("T", "D", target_cpu=1, draft_cpu=1)


def test_per_gamma_standalones_and_extra_runtimes() -> None:
    """STANDALONE-2c at several γ and SSD-1+1c on another draft runtime."""
    cfgs = ssd_bench.bench_configs(
        "T", "D", ["equal"], standalone_lookaheads=[3, 5], ssd_runtimes=["torch"]
    )
    by = {c.name: c for c in cfgs}
    assert list(by) == ["AR-2c", "STANDALONE-2c-g3", "STANDALONE-2c-g5", "SYNC-2c", "SSD-1+1c",
                        "SSD-1+1c-torch", "SSD-auto"]  # fmt: skip
    assert by["STANDALONE-2c-g3"].lookahead == 3 and by["STANDALONE-2c-g5"].lookahead == 5
    assert flag_value(by["STANDALONE-2c-g5"].args, "--speculative-num-draft-tokens") == "6"
    assert by["SSD-1+1c"].lookahead == 4 and by["SSD-1+1c-torch"].lookahead == 4
    assert flag_value(by["SSD-1+1c-torch"].args, "--ssd-draft-runtime") == "torch"
    assert flag_value(by["SSD-1+1c"].args, "--ssd-draft-runtime") is None
    with pytest.raises(ValueError, match="γ"):
        ssd_bench.bench_configs("T", "D", standalone_lookaheads=[0])


def _results(rates: dict[str, float], lookaheads: dict[str, int]) -> dict[str, Any]:
    """A results file of two prompts per configuration, 10 tokens each at `rates` tok/s."""
    batches = [
        {"config": n, "wall_s": 10 / r, "requests": [{"prompt_id": p, "completion_tokens": 10}]}
        for n, r in rates.items()
        for p in ("p1", "p2")
    ]
    return {
        "settings": {"sampling": {"greedy": True}, "batch_size": 1},
        "configs": [{"name": n, "lookahead": lookaheads.get(n)} for n in rates],
        "summary": {"configs": {n: {"tok_per_s": r} for n, r in rates.items()}},
        "batches": batches,
    }


def test_the_fastest_standalone_is_the_baseline() -> None:
    rates = {"AR-2c": 3.0, "STANDALONE-2c-g3": 3.6, "STANDALONE-2c-g4": 3.9,
             "STANDALONE-2c-g5": 3.7, "SSD-1+1c": 5.2, "SSD-1+1c-torch": 4.0}  # fmt: skip
    rows = ssd_bench.comparisons(_results(rates, {"STANDALONE-2c-g3": 3, "SSD-1+1c": 4}))
    pairs = {(r["config"], r["baseline"]): r["speedup"] for r in rows}
    assert pairs[("SSD-1+1c", "STANDALONE-2c-g4")] == pytest.approx(5.2 / 3.9)
    assert pairs[("STANDALONE-2c-g4", "AR-2c")] == pytest.approx(3.9 / 3.0)
    assert pairs[("SSD-1+1c", "SSD-1+1c-torch")] == pytest.approx(5.2 / 4.0)
    assert not any("g3" in key[1] or "g5" in key[1] for key in pairs)
    (vs_std,) = [r for r in rows if r["baseline"] == "STANDALONE-2c-g4"]
    assert vs_std["aim"] == 1.3 and vs_std["met"] is True  # equal prompts: interval = ratio
    assert ssd_bench.best_variant({"AR-2c": {"tok_per_s": 1.0}}, "STANDALONE-2c") is None


@pytest.fixture(scope="module")
def tiny_bench(
    tiny_target: Path,
    tiny_draft: Path,
    tiny_servers: dict[str, Server],
    tmp_path_factory: pytest.TempPathFactory,
):
    out_dir = tmp_path_factory.mktemp("ssd-bench")
    tok = datasets.load_tokenizer(tiny_target)
    prompts = datasets.load_prompts(datasets.HUMANEVAL, tok, 2)
    cfgs = [
        configs.autoregressive(tiny_target, name="AR-2c"),
        configs.ssd(tiny_target, tiny_draft, name="SSD-1+1c"),
    ]
    settings = harness.RunSettings(sampling=Sampling(max_new_tokens=16), concurrent_servers=True)
    shared = provider({"AR-2c": tiny_servers["ar"], "SSD-1+1c": tiny_servers["ssd"]})
    with restore_live_settings(tiny_servers["ssd"]):
        return harness.run_interleaved(
            cfgs, prompts, settings, log_dir=out_dir / "logs", servers=shared
        )


def test_live_ssd_batches_carry_counters_and_a_prediction(tiny_bench: dict[str, Any]) -> None:
    ssd_batches = [b for b in tiny_bench["batches"] if b["config"] == "SSD-1+1c"]
    assert len(ssd_batches) == 2
    assert all(b["ssd"]["rounds"] > 0 for b in ssd_batches)
    assert not any("ssd" in b for b in tiny_bench["batches"] if b["config"] == "AR-2c")
    # The speculator's cumulative counters behind the speedup model's components.
    total = ssd_stats.add(b["ssd"] for b in ssd_batches)
    outcomes = sum(v for k, v in total.items() if k.startswith("speculator_fanout_outcomes_"))
    hits = sum(v for k, v in total.items() if k.startswith("speculator_fanout_hits_"))
    builds = sum(v for k, v in total.items() if k.startswith("speculator_builds_at_depth_"))
    assert 0 < outcomes <= total["request_rounds"] and 0 <= hits <= outcomes
    assert builds > 0 and total["speculator_build_draft_forwards"] >= 2 * builds
    assert total["speculator_draft_forwards"] >= total["speculator_build_draft_forwards"]
    assert total["speculator_phase_s_glue"] > 0 and total["speculator_drafts_received"] > 0
    m = tiny_bench["summary"]["configs"]["SSD-1+1c"]["ssd"]
    assert 0.0 <= m["p_hit"] <= 1.0 and m["target_s"] > 0
    (row,) = [r for r in ssd_bench.comparisons(tiny_bench) if r["baseline"] == "AR-2c"]
    assert row["speedup"] > 0 and row["predicted"] is not None
    assert row["aim"] == 1.6 and row["met"] in (True, False)  # greedy, batch 1: the aim
    assert "SSD-1+1c" in ssd_bench.format_comparisons([row])

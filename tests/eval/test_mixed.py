"""Mixed traffic (`eval.mixed`): the draw is fixed by its seed, every request carries its own
token budget and stop strings, units have the drawn sizes, and a run on a real (tiny) server,
the session's shared tiny AR server, sends each request with its own settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_servers import provider

from eval import configs, datasets, harness, mixed
from eval.datasets import Prompt, Record
from eval.sampling import Sampling
from eval.servers import Server


def _pool(name: str, n: int) -> list[Prompt]:
    return [Prompt(Record(name, f"{name}/{i}", "x"), (1, 2, i + 3)) for i in range(n)]


def test_the_draw_is_seeded_alternates_pools_and_covers_the_requests():
    pools = [_pool("code", 3), _pool("chat", 2)]
    shape = mixed.MixedShape(requests=11, seed=3)
    prompts, sizes = mixed.mixed_workload(pools, shape)
    again, again_sizes = mixed.mixed_workload(pools, shape)
    assert prompts == again and sizes == again_sizes
    assert sum(sizes) == 11 and all(1 <= s <= 4 for s in sizes)
    assert [p.record.dataset for p in prompts[:4]] == ["code", "chat", "code", "chat"]
    assert prompts[4].id == "mixed/04/code/2" and prompts[6].id == "mixed/06/code/0"
    budgets = [p.sampling.max_new_tokens for p in prompts]
    assert all(1 <= b <= 128 for b in budgets) and len(set(budgets)) > 5
    assert all(p.sampling.greedy for p in prompts)
    assert any(p.sampling.stop for p in prompts) and not all(p.sampling.stop for p in prompts)
    other, _ = mixed.mixed_workload(pools, mixed.MixedShape(requests=11, seed=4))
    assert [p.sampling for p in other] != [p.sampling for p in prompts]
    with pytest.raises(ValueError):
        mixed.mixed_workload([[]], shape)
    with pytest.raises(ValueError):
        mixed.MixedShape(concurrency=(0, 2))


def test_units_follow_the_given_sizes_or_the_batch_size():
    assert harness.RunSettings(batch_size=2).units(5) == [range(0, 2), range(2, 4), range(4, 5)]
    sized = harness.RunSettings(unit_sizes=(1, 3, 1))
    assert sized.units(5) == [range(0, 1), range(1, 4), range(4, 5)]
    with pytest.raises(ValueError, match="do not cover"):
        sized.units(6)


def test_stop_strings_reach_sglang_params():
    assert Sampling(stop=("\n\n",)).to_sglang()["stop"] == ["\n\n"]
    assert "stop" not in Sampling().to_sglang()


def test_a_mixed_run_sends_each_request_with_its_own_settings(
    tiny_target: Path, tiny_ar: Server, tmp_path: Path
):
    tok = datasets.load_tokenizer(tiny_target)
    pools = [datasets.load_prompts(d, tok, 2) for d in datasets.DATASETS]
    shape = mixed.MixedShape(requests=6, max_new_tokens=(1, 12), concurrency=(1, 3), seed=1)
    prompts, sizes = mixed.mixed_workload(pools, shape)
    ar = configs.autoregressive(tiny_target, name="AR")
    settings = harness.RunSettings(unit_sizes=sizes, concurrent_servers=True)
    results = harness.run_interleaved(
        [ar],
        prompts,
        settings,
        log_dir=tmp_path / "logs",
        out_path=tmp_path / "r.json",
        servers=provider({"AR": tiny_ar}),
    )
    assert [len(b["requests"]) for b in results["batches"]] == list(sizes)
    sent = {p.id: p.sampling for p in prompts}
    got = [r for b in results["batches"] for r in b["requests"]]
    assert sorted(r["prompt_id"] for r in got) == sorted(sent)
    for r in got:
        assert r["error"] is None
        assert 1 <= r["completion_tokens"] <= sent[r["prompt_id"]].max_new_tokens
    # Budgets differ, so do lengths: the run did not apply one sampling to all.
    assert len({r["completion_tokens"] for r in got}) > 1
    described = {p["id"]: p for p in results["prompts"]}
    assert all(
        described[i]["sampling"]["max_new_tokens"] == s.max_new_tokens for i, s in sent.items()
    )


def test_live_variants_share_the_ssd_server_and_reset_what_they_change() -> None:
    """`python -m eval mixed --ssd-live NAME=JSON`: each variant runs on the SSD server itself
    with its live settings, and the SSD configuration's own units put those settings back to
    their defaults, so no unit inherits the previous unit's settings."""
    base = configs.Config("SSD-1+1c", ("--ssd-mode", "async"), (0, 1))
    assert configs.live_variants(base, []) == [base]
    ssd, auto = configs.live_variants(base, ['SSD-auto={"mode": "auto", "beta": 0.5}'])
    assert (ssd.name, ssd.server_name, dict(ssd.admin)) == (
        "SSD-1+1c", "SSD-1+1c", {"beta": 1.0, "mode": "async"}  # the server's own mode
    )  # fmt: skip
    assert (auto.name, auto.server_name, dict(auto.admin)) == (
        "SSD-auto", "SSD-1+1c", {"mode": "auto", "beta": 0.5}
    )  # fmt: skip
    assert auto.args == base.args and auto.cpus == base.cpus
    groups = harness.server_groups([configs.autoregressive("t", name="AR-2c"), ssd, auto])
    assert list(groups) == ["AR-2c", "SSD-1+1c"] and groups["SSD-1+1c"] == [ssd, auto]
    bad_specs = ("SSD-auto", '={"beta": 0.5}', "SSD-x=[1]", "SSD-x={}", 'SSD-x={"nope": 1}')
    for bad in (*bad_specs, 'SSD-x={"draft_vocab": 100}'):  # not a live setting
        with pytest.raises(ValueError):
            configs.live_variants(base, [bad])

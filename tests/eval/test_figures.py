"""Figures and report from synthetic results files; sweep plans and shared-server configs.

The results dicts here follow the harness's schema (configs, prompts, batches with requests and
SSD counter deltas) with made-up numbers, so every figure and table can be drawn without servers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from eval import figures, harness, report, ssd_bench, sweep
from eval.configs import Config
from eval.datasets import Prompt, Record
from eval.summary import summarize

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _config(name: str, algorithm: str, admin: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"name": name, "args": [], "cpus": None, "threads": None, "env": {}, "notes": "",
           "algorithm": algorithm, "lookahead": None if algorithm == "NONE" else 4}  # fmt: skip
    if admin is not None:
        out |= {"admin": sweep.LIVE_DEFAULTS | admin, "share": "SSD-1+1c"}
    return out


def _request(prompt_id: str, tokens: int, latency: float, spec: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"completion_tokens": tokens}
    if spec:
        meta["spec_verify_ct"] = tokens // 3
    return {"prompt_id": prompt_id, "start": 0.0, "latency_s": latency,
            "completion_tokens": tokens, "prompt_tokens": 20, "output_ids": list(range(tokens)),
            "finish_reason": {"type": "length"}, "meta_info": meta, "ttft_s": None,
            "chunk_times_s": None, "error": None, "tok_per_s": tokens / latency}  # fmt: skip


def _ssd_delta(rounds: int, batch: int, hit_rate: float) -> dict[str, float]:
    req = rounds * batch
    hits = round(req * hit_rate)
    return {"rounds": rounds, "request_rounds": req, "verify_s": 0.4 * rounds,
            "wait_draft_s": 0.05 * rounds, "forward_s": 0.3 * rounds,
            "speculator_steps": rounds, "speculator_build_s": 0.3 * rounds,
            "speculator_backup_s": 0.1 * (req - hits), "rounds_cache": hits,
            "rounds_jit": req - hits, "accepted_cache": 3 * hits,
            "accepted_jit": req - hits}  # fmt: skip


def make_results(
    configs: list[tuple[dict[str, Any], float, float]],
    prompts: list[tuple[str, str]],
    *,
    batch_size: int = 1,
    temperature: float = 0.0,
    b_star: int | None = None,
) -> dict[str, Any]:
    """A finished run: `configs` as (config dict, tok/s per request, hit rate) over `prompts`
    ((id, dataset) pairs), 32 tokens per request."""
    batches = []
    units = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
    for unit, chunk in enumerate(units):
        for config, speed, hit_rate in configs:
            spec = config["algorithm"] != "NONE"
            # Batching helps throughput and hurts latency, as on a real server.
            latency = 32 / speed * (1 + 0.5 * (len(chunk) - 1))
            reqs = [_request(pid, 32, latency, spec) for pid, _ in chunk]
            batch: dict[str, Any] = {"config": config["name"], "repeat": 0, "unit": unit,
                                     "start": 0.0, "wall_s": latency, "tokens": 32 * len(chunk),
                                     "requests": reqs}  # fmt: skip
            if config["algorithm"] == "SSD":
                batch["ssd"] = _ssd_delta(10, len(chunk), hit_rate)
                batch["fallback"] = {"backup": "auto", "auto_batch_threshold": b_star}
            batches.append(batch)
    results = {
        "schema": harness.SCHEMA, "status": "complete", "created_at": 0.0,
        "git": {"commit": "0" * 40, "dirty": False}, "machine": {"cpu_count": 2},
        "settings": {"sampling": {"max_new_tokens": 32, "temperature": temperature,
                                  "greedy": temperature == 0}, "batch_size": batch_size,
                     "repeats": 1},
        "prompts": [{"id": pid, "dataset": d} for pid, d in prompts],
        "configs": [c for c, _, _ in configs], "batches": batches,
    }  # fmt: skip
    results["summary"] = summarize(results)
    return results


PROMPTS = [("HumanEval/0", "humaneval"), ("81", "mtbench")]
AR = _config("AR-2c", "NONE")


def write_all(results_dir: Path) -> None:
    """Every input of every figure, in quick mode, plus a trace replay."""
    main = make_results(
        [(AR, 2.0, 0), (_config("STANDALONE-2c", "STANDALONE"), 2.4, 0),
         (_config("SYNC-1+1c", "SSD"), 2.2, 0.0), (_config("SSD-1+1c", "SSD"), 4.0, 0.8)],
        PROMPTS,
    )  # fmt: skip
    main["ssd_comparisons"] = ssd_bench.comparisons(main)
    beta = make_results(
        [(AR, 2.0, 0)]
        + [(_config(f"SSD β={b}", "SSD", {"beta": b}), 3 + b, b) for b in (1.0, 0.7, 0.4)],
        PROMPTS,
        temperature=0.7,
    )
    fanout = make_results(
        [(_config(f"SSD {s} B=4", "SSD", {"fanout": s, "fanout_budget": 4}), 3.5, h)
         for s, h in (("geometric", 0.8), ("uniform", 0.5))],
        PROMPTS,
    )  # fmt: skip
    eagle3 = make_results(
        [(AR, 2.0, 0), (_config("EAGLE3-2c", "EAGLE3"), 2.6, 0),
         (_config("SSD-1+1c", "SSD"), 4.0, 0.8), (_config("SSD-HEAD-1+1c", "SSD"), 3.0, 0.6)],
        PROMPTS,
    )  # fmt: skip
    files = {
        "paper-main-quick": main, "sweep-beta-quick": beta, "sweep-fanout-quick": fanout,
        "eagle3-b1-greedy-quick": eagle3,
    }  # fmt: skip
    for b in (1, 2, 4):
        backups = [(_config(f"SSD {k}", "SSD", {"backup": k}), s, 0.7)
                   for k, s in (("jit", 4.0), ("ngram", 3.0 + b / 4), ("random", 2.5))]  # fmt: skip
        prompts = [(f"HumanEval/{i}", "humaneval") for i in range(max(2, b))]
        files[f"sweep-backup-b{b}-quick"] = make_results(
            [(AR, 2.0, 0), *backups], prompts, batch_size=b, b_star=2
        )
    for name, data in files.items():
        (results_dir / f"{name}.json").write_text(json.dumps(data))
    trace = [{"fanout": s, "budget": b, "trace": "greedy", "hit_rate": h * b / 8}
             for b in (2, 4, 8) for s, h in (("geometric", 0.9), ("uniform", 0.6))]  # fmt: skip
    (results_dir / figures.TRACE_REPLAY).write_text(json.dumps({"results": trace}))


def test_every_figure_and_the_report(tmp_path: Path) -> None:
    write_all(tmp_path)
    drawn = figures.make_all(tmp_path, quick=True)
    assert [f.key for f in drawn] == [
        "tok_per_s_by_dataset", "eagle3_comparison", "speedup_vs_batch",
        "latency_throughput_pareto", "beta_sweep",
        "fanout_geometric_vs_uniform", "backup_vs_batch", "predicted_vs_measured",
    ]  # fmt: skip
    for f in drawn:
        data = f.png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000, f.key
        assert f.png.parent == tmp_path / "figures-quick" and f.sources
    eagle3 = next(f for f in drawn if f.key == "eagle3_comparison")
    assert [p.name for p in eagle3.sources] == ["eagle3-b1-greedy-quick.json"]
    backup = next(f for f in drawn if f.key == "backup_vs_batch")
    assert any("b*" in n and "2" in n for n in backup.notes)
    assert {p.name for p in backup.sources} == {f"sweep-backup-b{b}-quick.json" for b in (1, 2, 4)}

    path = report.write_report(tmp_path, quick=True)
    assert path == tmp_path / "report-quick.md"
    text = path.read_text()
    for f in drawn:
        assert f"![{f.title}](figures-quick/{f.key}.png)" in text
    assert "| SSD-1+1c | 4.00 | 2.00x |" in text  # main table: tok/s, speedup over AR
    assert "| SSD β=0.4 | 0.4 |" in text and "b* = 2" in text
    assert "`sweep-backup-b4-quick.json`" in text and "`paper-main-quick.json`" in text
    assert "EAGLE-3: unavailable" in text and "not lossless" in text
    assert "Not run" not in text


def test_missing_inputs_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="eval.figures"):
        assert figures.make_all(tmp_path, quick=False) == []
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == len(figures.FIGURES)
    text = report.write_report(tmp_path, quick=False).read_text()
    assert text.count("Not run") >= 3 and "No figure could be drawn" in text

    write_all(tmp_path)  # quick files only: the full-mode figures still find no inputs,
    drawn = figures.make_all(tmp_path, quick=False)  # except the trace replay (no mode)
    assert [f.key for f in drawn] == ["fanout_geometric_vs_uniform"]
    assert [p.name for p in drawn[0].sources] == [figures.TRACE_REPLAY]


def test_pareto_front_keeps_undominated_points() -> None:
    points = [(1.0, 1.0), (2.0, 2.0), (1.5, 3.0), (3.0, 2.5), (0.5, 0.5)]
    assert figures.pareto_front(points) == [(0.5, 0.5), (1.0, 1.0), (2.0, 2.0), (3.0, 2.5)]


# --- sweep plans and shared servers --------------------------------------------------------------


def _fake_prompts(dataset: str, n: int) -> list[Prompt]:
    return [Prompt(Record(dataset, f"{dataset}-{i}", "text"), (1, 2, 3)) for i in range(n)]


def test_sweep_plans_share_the_ssd_server() -> None:
    base = sweep.base_configs("T", "D", lookahead=4, target_cpu=0, draft_cpu=1)
    ar, ssd = base[sweep.AR], base[sweep.SSD]
    (beta,) = sweep.sweep_plans("beta", ar, ssd, _fake_prompts, quick=True)
    assert beta.name == "sweep-beta-quick" and beta.settings.sampling.temperature == 0.7
    points = beta.configs[1:]
    assert {c.server_name for c in points} == {ssd.name} and all(c.args == ssd.args for c in points)
    assert [c.admin["beta"] for c in points] == list(sweep.QUICK.betas)
    assert all(set(c.admin) == set(sweep.LIVE_DEFAULTS) for c in points)  # nothing inherited
    backup = sweep.sweep_plans("backup", ar, ssd, _fake_prompts, quick=True)
    sizes = [(p.settings.batch_size, len(p.prompts), p.settings.sampling.max_new_tokens)
             for p in backup]  # fmt: skip
    assert sizes == [(1, 2, 32), (2, 2, 32), (4, 4, 16)]  # the same tokens per point
    (fanout,) = sweep.sweep_plans("fanout", ar, ssd, _fake_prompts, quick=False)
    assert len(fanout.configs) == 2 * len(sweep.FULL.budgets)
    main = sweep.main_plan(list(base.values()), _fake_prompts, quick=True)
    assert not main.pooled and [p.record.dataset for p in main.prompts] == ["humaneval", "mtbench"]
    assert sweep.estimate_s([main, beta, *backup, fanout]) > 0
    with pytest.raises(ValueError):
        sweep.sweep_plans("nope", ar, ssd, _fake_prompts, quick=True)
    with pytest.raises(ValueError):
        sweep.point(ssd, "x", mode="sync")  # not a live setting


def test_shared_server_configs_round_trip_and_validate() -> None:
    ssd = Config("SSD", ("--speculative-algorithm", "SSD"))
    a = sweep.point(ssd, "SSD β=0.5", beta=0.5)
    assert Config.from_dict(a.to_dict()) == a
    assert "share" not in ssd.to_dict() and "admin" not in ssd.to_dict()  # old files resume
    b = sweep.point(ssd, "SSD β=1", beta=1.0)
    assert {k: [c.name for c in v] for k, v in harness.server_groups([a, b]).items()} == {
        "SSD": ["SSD β=0.5", "SSD β=1"]
    }
    with pytest.raises(ValueError, match="needs `admin`"):
        harness.server_groups([a, Config("SSD 2", ssd.args, share="SSD")])
    other = Config("SSD 3", ("--other",), share="SSD", admin={"beta": 1.0})
    with pytest.raises(ValueError, match="differ"):
        harness.server_groups([a, other])
    assert harness.fits_together([a, sweep.point(ssd, "b", beta=0.2)]) == harness.fits_together([a])


def test_the_throughput_figure_names_its_machine_and_file(tmp_path: Path) -> None:
    results = make_results([(AR, 2.0, 0), (_config("SSD-1+1c", "SSD"), 4.0, 0.8)], PROMPTS)
    results["machine"] = {
        "lscpu": {"Model name": "AMD EPYC", "CPU(s)": "2", "isa": "avx2,avx512_bf16,avx512f"},
        "isa_caps": {"ATEN_CPU_CAPABILITY": "avx2"},
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(results))
    assert figures.machine_label(results) == "AMD EPYC, 2 CPUs, avx512_bf16, capped avx2"
    png = figures.fig_throughput(path, tmp_path / "out" / "headline.png")
    assert png == tmp_path / "out" / "headline.png" and png.read_bytes().startswith(PNG_MAGIC)
    results["machine"] = {"lscpu": {"Model name": "Xeon", "CPU(s)": "2", "isa": "amx_bf16"}}
    assert figures.machine_label(results) == "Xeon, 2 CPUs, amx_bf16"
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**results, "batches": []}))
    with pytest.raises(ValueError, match="no measured batches"):
        figures.fig_throughput(empty, tmp_path / "x.png")

"""`python -m eval.trace {record,from-run,replay}`: the command line of `eval.trace`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eval import cli_options, datasets
from eval import trace as package
from eval.configs import model_dirs
from eval.provenance import model_info, run_header
from eval.results_io import read_results
from eval.sampling import Sampling
from eval.trace.from_run import RunTraceError, check_run_file, run_answers, trace_from_run
from eval.trace.record import add_recording_options, load_recording, record
from eval.trace.replay import ReplayConfig, format_replay_table, replay, replay_parallel
from sglang_ssd.config import DEFAULT_LOOKAHEAD, FANOUT_SHAPES, SSDConfig
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.speculator.runtimes import resolve

RESULTS = Path("eval/results")
LOOKAHEAD = DEFAULT_LOOKAHEAD  # the launcher's γ
TRACE_VERSION = 1
# What a replay result without these keys (written before they existed) was made with.
LEGACY = {"draft_runtime": "torch", "draft_vocab": 0}


def cmd_record(a: argparse.Namespace, argv: Sequence[str]) -> int:
    """Record one trace per temperature in `a.temperatures` into `a.out_dir`."""
    target_dir, draft_dir, prompts, target, model = load_recording(a)
    config = SSDConfig(lookahead=a.lookahead, beta=1.0, fanout="geometric", mode="async")
    for temperature in a.temperatures:
        sampling = Sampling.of(temperature)
        engine = SpeculatorEngine(model, config, seed=a.seed)
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        ids = [p.input_ids for p in prompts]
        body = record(target, engine, ids, sampling, a.max_new_tokens, model.eos_token_ids, a.seed)
        trace = {
            "kind": "ssd-trace",
            "version": TRACE_VERSION,
            **run_header("eval.trace", argv),
            "models": {"target": model_info(target_dir), "draft": model_info(draft_dir)},
            "dataset": {
                "source": datasets.source_info(datasets.HUMANEVAL),
                "prompts": [p.describe() for p in prompts],
            },
            "torch_threads": torch.get_num_threads(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "seconds": time.perf_counter() - t0,
            **body,
        }
        out = a.out_dir / f"trace-{sampling.name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(trace, indent=1) + "\n")
        s = body["summary"]
        print(
            f"{sampling.name}: {s['rounds']} rounds, hit rate {s['hit_rate']:.3f}, "
            f"L {s['mean_accept_length']:.2f}, verify {s['median_verify_s']:.3f} s, "
            f"build {s['median_build_s']:.3f} s -> {out}",
            flush=True,
        )
    return 0


def cmd_from_run(a: argparse.Namespace, argv: Sequence[str]) -> int:
    """Write the greedy trace of `a.config`'s outputs in the `eval run` results `a.results`."""
    results = check_run_file(read_results(a.results), a.results)
    target_dir, draft_dir = model_dirs(a.target, a.draft)
    tokenizer = datasets.load_tokenizer(target_dir)
    ids = [p["id"] for p in results["prompts"]]
    prompts = datasets.load_prompts(
        results["experiment"]["dataset"], tokenizer, ids=ids, answers=run_answers(results)
    )
    body = trace_from_run(results, prompts, config=a.config, repeat=a.repeat, lookahead=a.lookahead)
    trace = {
        "kind": "ssd-trace",
        "version": TRACE_VERSION,
        **run_header("eval.trace", argv),
        "models": {"target": model_info(target_dir), "draft": model_info(draft_dir)},
        "dataset": {
            "source": {
                name: datasets.source_info(name)
                for name in datasets.sets_of(results["experiment"]["dataset"])
            },
            "prompts": [p.describe() for p in prompts],
        },
        **body,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(trace, indent=1) + "\n")
    s = body["summary"]
    print(f"{s['prompts']} prompts, {s['tokens']} output tokens of {a.config} -> {a.out}")
    return 0


def _key(r: dict[str, Any]) -> tuple[str, str, int, int]:
    return (str(r["trace_file"]), r["fanout"], r["budget"], r["depth"])


def cmd_replay(a: argparse.Namespace, argv: Sequence[str]) -> int:
    """Replay every trace under every (shape, B, D); results (resumable) into `a.out`."""
    traces = {str(p): json.loads(Path(p).read_text()) for p in a.traces}
    first = next(iter(traces.values()))
    draft_dir = Path(a.draft) if a.draft else Path(first["models"]["draft"]["path"])
    runtime = resolve(a.draft_runtime, str(draft_dir))  # "auto" recorded as what it ran
    draft = {
        "draft": str(draft_dir),
        "runtime": runtime,
        "kv_slots": a.kv_slots,
        "draft_vocab": a.draft_vocab,
    }
    configs = [
        ReplayConfig(shape, budget, depth)
        for depth in a.depths
        for budget in a.budgets
        for shape in a.fanouts
    ]
    results: list[dict[str, Any]] = []
    if a.resume and a.out.is_file():
        same = {"batch": a.batch, "draft_runtime": runtime, "draft_vocab": a.draft_vocab}
        results = [
            r
            for r in json.loads(a.out.read_text())["results"]
            if all(r.get(k, LEGACY.get(k)) == v for k, v in same.items())
        ]
    done = {_key(r) for r in results}
    tasks = [
        (Path(p), cfg)
        for p in traces
        for cfg in configs
        if (p, cfg.fanout, cfg.budget, cfg.depth) not in done
    ]
    load_before = os.getloadavg()
    t0 = time.perf_counter()

    def save(result: dict[str, Any] | None = None) -> None:
        if result is not None:
            results.append(
                {
                    **result,
                    "batch": a.batch,
                    "draft_runtime": runtime,
                    "draft_vocab": a.draft_vocab,
                }
            )
        report = {
            "kind": "ssd-trace-replay",
            **run_header("eval.trace", argv),
            "complete": len(results) == len(done) + len(tasks),
            "draft": model_info(draft_dir),
            "draft_runtime": runtime,
            "draft_vocab": a.draft_vocab,
            "jobs": a.jobs,
            "torch_threads": 1 if a.jobs > 1 else torch.get_num_threads(),
            "seconds": time.perf_counter() - t0,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "results": sorted(results, key=lambda r: (r["trace"], -r["depth"], r["budget"])),
        }
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1) + "\n")

    print(f"replaying {len(tasks)} (trace, config) pairs ({len(done)} already done)", flush=True)
    if a.jobs > 1:
        replay_parallel(draft, tasks, a.jobs, a.batch, a.seed, save)
    else:
        torch.set_num_threads(a.threads or torch.get_num_threads())
        model = cli_options.load_draft(**draft)
        for path, cfg in tasks:
            (result,) = replay(model, traces[str(path)], [cfg], a.batch, a.seed)
            save({**result, "trace_file": str(path)})
    save()
    print()
    print(format_replay_table(results))
    print(f"\nwrote {a.out}")
    return 0


def parser() -> argparse.ArgumentParser:
    """`python -m eval.trace`'s parser: the `record` and `replay` subcommands."""
    out = argparse.ArgumentParser(
        prog="python -m eval.trace",
        description=(package.__doc__ or "").split("\n\n")[0],
    )
    sub = out.add_subparsers(dest="command", required=True)
    p = sub.add_parser("record", help="record SSD rounds on the real pair")
    add_recording_options(p, 5, RESULTS)
    p.set_defaults(func=cmd_record)
    p = sub.add_parser("replay", help="replay traces with a scripted target")
    p.add_argument(
        "--traces",
        nargs="+",
        type=Path,
        default=[RESULTS / "trace-greedy.json", RESULTS / "trace-t0.7.json"],
        help="trace files of `record` or `from-run` (default: eval/results/trace-greedy.json "
        "and trace-t0.7.json)",
    )
    p.add_argument(
        "--fanouts", nargs="+", choices=FANOUT_SHAPES, default=list(FANOUT_SHAPES),
        help="fan-out shapes (default: both)",
    )  # fmt: skip
    p.add_argument(
        "--budgets", type=int, nargs="+", default=[2, 4, 8, 16],
        help="fan-out budgets B (default: 2 4 8 16)",
    )  # fmt: skip
    p.add_argument(
        "--depths", type=int, nargs="+", default=[4, 2], help="tree depths D (default: 4 2)"
    )
    p.add_argument("--batch", type=int, help="prompts replayed together (default: all)")
    p.add_argument(
        "--jobs", type=int, default=1, help="processes, one core and thread each (default 1)"
    )
    p.add_argument("--resume", action="store_true", help="keep and skip results in --out")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="results file (JSON), e.g. eval/results/trace-replay.json",
    )
    cli_options.add_draft_runtime(p)
    cli_options.add_draft_vocab(p)
    p.set_defaults(func=cmd_replay)
    p = sub.add_parser("from-run", help="a greedy trace of an `eval run` results file")
    p.add_argument("results", type=Path, help="an `eval run` results file (greedy)")
    p.add_argument("--config", default="AR-2c", help="whose outputs to take (default AR-2c)")
    p.add_argument("--repeat", type=int, default=0, help="which repeat of the run (default 0)")
    p.add_argument(
        "--lookahead", "--gamma", type=int, default=LOOKAHEAD, help="γ of the replays (default 4)"
    )
    p.add_argument("--out", type=Path, required=True, help="the trace file to write (JSON)")
    p.set_defaults(func=cmd_from_run)
    for p in sub.choices.values():
        cli_options.add_pair(p)
        p.add_argument("--seed", type=int, default=0, help="the engine's sampling seed (default 0)")
        p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
        p.add_argument(
            "--kv-slots", type=int, default=16384, help="draft KV pool tokens (default 16384)"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cli = parser()
    a = cli.parse_args(argv)
    try:
        return a.func(a, argv)
    except (RunTraceError, FileNotFoundError, ValueError) as exc:  # bad input: say it, no trace
        cli.exit(2, f"python -m eval.trace {a.command}: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())

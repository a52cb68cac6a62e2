"""`python -m eval.bench_speculator`: the benchmark's command line and its two worker processes
(see `eval.bench_speculator`)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eval import bench_speculator as package
from eval import cli_options
from eval.bench_speculator.tables import format_table, summarize
from eval.bench_speculator.timing import (
    BATCHES,
    BUDGETS,
    CLEAN_FOREIGN_CORES,
    DEPTHS,
    LOOKAHEAD,
    Stopwatch,
    bench_draft,
    bench_target,
    make_prefixes,
)
from eval.cpuload import machine_busy_s, wait_for_load
from eval.provenance import model_info, run_header

RESULTS = Path("eval/results")


def _barrier(sync_dir: Path, role: str, other: str, timeout_s: float = 900.0) -> int:
    """Tell the other worker we are loaded, wait until it is too; returns its pid."""
    mine = sync_dir / f"ready-{role}"
    mine.with_suffix(".tmp").write_text(str(os.getpid()))
    mine.with_suffix(".tmp").rename(mine)
    deadline = time.monotonic() + timeout_s
    while not (sync_dir / f"ready-{other}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{other} worker never became ready")
        time.sleep(0.05)
    return int((sync_dir / f"ready-{other}").read_text())


def run_worker(role: str, cpu: int, spec_path: Path, out: Path) -> None:
    """Subprocess body: pin to `cpu`, load the model, time it, write JSON to `out`."""
    from sglang_ssd.launch.placement import pin_process

    pin_process([cpu])
    spec = json.loads(spec_path.read_text())
    sync_dir = spec_path.parent
    prefixes = spec["prefixes"]
    t0 = time.perf_counter()
    if role == "draft":
        model = cli_options.load_draft(
            spec["draft"], spec.get("draft_runtime", "torch"), spec["kv_slots"],
            spec.get("draft_vocab", 0),
        )  # fmt: skip
        load_s = time.perf_counter() - t0
        watch = Stopwatch([_barrier(sync_dir, "draft", "target")])
        result: Any = bench_draft(
            model,
            prefixes,
            spec["budgets"],
            spec["depths"],
            spec["batches"],
            spec["repeats"],
            spec["lookahead"],
            spec["temperature"],
            progress=lambda s: print(s, file=sys.stderr, flush=True),
            stopwatch=watch,
            max_repeats=spec["max_repeats"],
        )
    else:
        from eval.trace.target import HFTarget

        target = HFTarget(spec["target"])
        load_s = time.perf_counter() - t0
        watch = Stopwatch([_barrier(sync_dir, "target", "draft")])
        result = bench_target(
            target,
            prefixes,
            spec["batches"],
            spec["lookahead"],
            spec["repeats"],
            stop=lambda: (sync_dir / "done-draft").exists(),
            temperature=spec["temperature"],
            stopwatch=watch,
        )
    info = {
        "role": role,
        "cpu": cpu,
        "affinity": sorted(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "load_s": load_s,
    }
    out.write_text(json.dumps({"worker": info, "result": result}))
    if role == "draft":
        (sync_dir / "done-draft").touch()


def _our_cpu_s() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m eval.bench_speculator", description=package.__doc__
    )
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--repeats", type=int, default=5, help="clean samples wanted per point")
    parser.add_argument("--max-repeats", type=int, default=8, help="passes at most")
    parser.add_argument("--lookahead", "--gamma", type=int, default=LOOKAHEAD)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy requests")
    parser.add_argument("--prefix", type=int, default=200, help="prefix tokens per request")
    parser.add_argument("--target-cpu", type=int, default=0)
    parser.add_argument("--draft-cpu", type=int, default=1)
    cli_options.add_pair(parser)
    parser.add_argument("--kv-slots", type=int, default=16384)
    parser.add_argument(
        "--draft-vocab", type=int, default=0, help="reduced draft vocabulary N (0 = all)"
    )
    cli_options.add_draft_runtime(parser)
    parser.add_argument("--wait-load", type=float, help="wait until the 1-min load is below")
    parser.add_argument("--max-wait", type=float, default=3600.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench-speculator.json")
    parser.add_argument(
        "--resummarize", type=Path, help="recompute the summary of a results file, print it"
    )
    parser.add_argument("--worker", choices=("draft", "target"), help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    return parser


def _print_tables(rows: Sequence[dict[str, Any]]) -> None:
    print(format_table(rows))
    print(format_table(rows, minima=True))


def resummarize(path: Path) -> None:
    """Recompute the summary of a results file in place and print its tables."""
    report = json.loads(path.read_text())
    report["summary"] = summarize(report["raw"]["draft"], report["raw"]["target"])
    path.write_text(json.dumps(report, indent=1) + "\n")
    _print_tables(report["summary"])


def _wait_for_quiet(threshold: float, max_wait_s: float) -> float:
    def say(load: float, _free_gb: float) -> None:
        print(f"load average {load:.2f} > {threshold}: waiting", flush=True)

    return wait_for_load(threshold, max_wait_s, on_wait=say)["waited_s"]


def _worker_argv(role: str, cpu: int, spec_path: Path) -> list[str]:
    out = spec_path.parent / f"{role}.json"
    return [sys.executable, "-m", "eval.bench_speculator", "--worker", role, "--cpu", str(cpu),
            "--spec", str(spec_path), "--out", str(out)]  # fmt: skip


def run_workers(spec: dict[str, Any], cpus: dict[str, int]) -> dict[str, Any] | None:
    """Run the target and draft workers at once, each on its CPU in `cpus`, on `spec`.

    Returns:
        {"out": each worker's JSON by role, "cpu": busy/ours/foreign CPU-seconds meanwhile,
        "load_average_before"/"_after", "elapsed_s"}, or None when a worker failed.
    """
    with tempfile.TemporaryDirectory(prefix="bench-speculator-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        load_before = os.getloadavg()
        started, busy_before, ours_before = time.time(), machine_busy_s(), _our_cpu_s()
        procs = {
            role: subprocess.Popen(_worker_argv(role, cpu, spec_path), env=env)
            for role, cpu in cpus.items()
        }
        codes = {role: p.wait() for role, p in procs.items()}
        busy, ours = machine_busy_s() - busy_before, _our_cpu_s() - ours_before
        load_after = os.getloadavg()
        if any(codes.values()):
            print(f"worker failed: {codes}", file=sys.stderr)
            return None
        out = {role: json.loads((Path(tmp) / f"{role}.json").read_text()) for role in procs}
    return {
        "out": out,
        "cpu": {"busy_s": busy, "ours_s": ours, "foreign_s": max(0.0, busy - ours)},
        "load_average_before": load_before,
        "load_average_after": load_after,
        "elapsed_s": time.time() - started,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _parser().parse_args(argv)
    if a.worker:
        run_worker(a.worker, a.cpu, a.spec, a.out)
        return 0
    if a.resummarize:
        resummarize(a.resummarize)
        return 0

    from eval import datasets
    from eval.configs import model_dirs

    target_dir, draft_dir = model_dirs(a.target, a.draft)
    prompts = datasets.load_prompts(datasets.HUMANEVAL, datasets.load_tokenizer(target_dir), 8)
    prefixes = make_prefixes([p.input_ids for p in prompts], max(a.batches), a.prefix)
    waited = _wait_for_quiet(a.wait_load, a.max_wait) if a.wait_load else 0.0
    spec = {
        "target": str(target_dir),
        "draft": str(draft_dir),
        "prefixes": prefixes,
        "budgets": a.budgets,
        "depths": a.depths,
        "batches": a.batches,
        "repeats": a.repeats,
        "max_repeats": a.max_repeats,
        "clean_foreign_cores": CLEAN_FOREIGN_CORES,
        "lookahead": a.lookahead,
        "temperature": a.temperature,
        "kv_slots": a.kv_slots,
        "draft_vocab": a.draft_vocab,
        "draft_runtime": a.draft_runtime,
    }
    run = run_workers(spec, {"target": a.target_cpu, "draft": a.draft_cpu})
    if run is None:
        return 1
    out, elapsed = run["out"], run["elapsed_s"]
    rows = summarize(out["draft"]["result"], out["target"]["result"])
    report = {
        "kind": "bench-speculator",
        **run_header("eval.bench_speculator", argv),
        "models": {"target": model_info(Path(target_dir)), "draft": model_info(Path(draft_dir))},
        "settings": {k: v for k, v in spec.items() if k != "prefixes"},
        "prefix_lengths": [len(p) for p in prefixes],
        "load_average_before": run["load_average_before"],
        "load_average_after": run["load_average_after"],
        "waited_for_quiet_s": waited,
        "elapsed_s": elapsed,
        # CPU-seconds the machine was busy while the workers ran, ours (workers + this
        # process) and everything else (other users' jobs), and the latter per second.
        "cpu": run["cpu"],
        "foreign_cores_busy_mean": run["cpu"]["foreign_s"] / elapsed,
        "workers": {role: o["worker"] for role, o in out.items()},
        "summary": rows,
        "raw": {"draft": out["draft"]["result"], "target": out["target"]["result"]},
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    _print_tables(rows)
    print(
        f"load average before {run['load_average_before']}, after "
        f"{run['load_average_after']}; wrote {a.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

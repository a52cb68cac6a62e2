"""Time the speculator's round against the target's verify, each on its own core.

T_p (DESIGN.md §1, Theorem 7) is the speculator's time to build the next round's cache in units
of one target verify. Two worker subprocesses run at the same time, as SSD deploys them on two
CPUs: each pins itself to one core (`os.sched_setaffinity`, `torch.set_num_threads(1)`) before it
loads its model.
- draft worker (0.5B, bf16, `SpeculatorEngine`, async, β = 1, geometric fan-out): the time of
  `engine.build` (glue forward + D tree-decode forwards + fork/sample/populate) for fan-out budget
  B, tree depth D and batch size b, in steady state: the draft being extended is a depth-D cache
  hit, as in a hit round. Also the just-in-time draft (γ sequential one-token forwards, the SD
  baseline's drafting cost) per b.
- target worker (1.5B, bf16, transformers + `DynamicCache`): one verify of γ + 1 tokens per
  request (forward over [root, d_1..d_γ] on a ~`--prefix`-token prefix, then `saguaro.verify`),
  per b, repeated until the draft worker is done.

Every sample records the cores other processes kept busy meanwhile (`Stopwatch`); medians use
the clean samples (<= 0.25 foreign cores) when there are at least 3, and the draft worker adds
passes (up to `--max-repeats`) until every point has `--repeats` clean samples.

Per (b, D) group the draft worker opens b requests on fresh ~`--prefix`-token prefixes, serves a
JIT draft (timed), does one unmeasured warm-up build and hit, then one measured build per B (each
followed by a hit on the smallest accept length, so the prefix grows by ~1 token per point).
Repeats rotate the order of b and D and reverse the order of B; medians of >= 5 repeats are
reported with every raw time, the command line and the load average before and after.

Usage: python -m eval.bench_speculator [--repeats 5] [--wait-load 2.5] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from eval.cpuload import machine_busy_s, process_cpu_s
from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import SamplingBatch, verify
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine

RESULTS = Path("eval/results")
LOOKAHEAD = 4
BUDGETS = (1, 2, 4, 8, 16, 24)
DEPTHS = (1, 2, 3, 4)
BATCHES = (1, 2, 4)
# A sample during which other processes kept more than this many cores busy is not "clean".
CLEAN_FOREIGN_CORES = 0.25


def _rotate(items: Sequence[int], shift: int) -> list[int]:
    shift %= max(1, len(items))
    return list(items[shift:]) + list(items[:shift])


class Stopwatch:
    """Wall time of a sample plus the cores other processes kept busy meanwhile ("foreign").

    Foreign cores = (machine busy CPU-seconds - CPU-seconds of `pids`) / wall time, from
    /proc/stat and /proc/<pid>/stat (10 ms ticks). `pids` are ours: this worker and its partner.
    """

    def __init__(self, pids: Sequence[int] = ()) -> None:
        self.pids = [os.getpid(), *pids]
        self._start = (0.0, 0.0, 0.0)

    def start(self) -> None:
        self._start = (time.perf_counter(), machine_busy_s(), process_cpu_s(self.pids))

    def stop(self) -> tuple[float, float]:
        """(seconds, foreign cores) since `start`."""
        t0, busy0, ours0 = self._start
        wall = time.perf_counter() - t0
        foreign = machine_busy_s() - busy0 - (process_cpu_s(self.pids) - ours0)
        return wall, max(0.0, foreign / wall)


def make_prefixes(prompts: Sequence[Sequence[int]], count: int, length: int) -> list[list[int]]:
    """`count` token lists of `length`: prompt i followed by the next prompts, cut to length."""
    out = []
    for i in range(count):
        tokens: list[int] = []
        j = i
        while len(tokens) < length:
            tokens += list(prompts[j % len(prompts)])
            j += 1
        out.append(tokens[:length])
    return out


def _advance(engine: SpeculatorEngine, rids: Sequence[str], depth: int) -> None:
    """Apply, per request, the cached outcome with the smallest k (a hit: the next draft is a
    depth-D branch); a request without branches gets a miss and a JIT draft instead."""
    outcomes = []
    for rid in rids:
        branches = engine.requests[rid].branches
        if branches is not None and branches.ks:
            row = min(range(len(branches.ks)), key=lambda i: branches.ks[i])
            outcomes.append(OutcomeIn(rid, branches.ks[row], branches.bonus[row]))
        else:
            outcomes.append(OutcomeIn(rid, 0, engine.requests[rid].committed[-1]))
    engine.apply_outcomes(outcomes)
    need = [rid for rid in rids if engine.requests[rid].draft is None]
    if need:
        engine.serve(need, "jit", depth)


def bench_draft(
    model: DraftModel,
    prefixes: Sequence[Sequence[int]],
    budgets: Sequence[int] = BUDGETS,
    depths: Sequence[int] = DEPTHS,
    batches: Sequence[int] = BATCHES,
    repeats: int = 5,
    lookahead: int = LOOKAHEAD,
    temperature: float = 0.0,
    progress: Callable[[str], None] | None = None,
    stopwatch: Stopwatch | None = None,
    max_repeats: int | None = None,
) -> dict[str, Any]:
    """Build and JIT timings of the draft (see the module docstring for the procedure).

    Runs `repeats` passes, then more (up to `max_repeats`) while some point has fewer than
    `repeats` clean samples (foreign cores <= CLEAN_FOREIGN_CORES).

    Returns:
        {"builds": [{batch, depth, budget, fanout, seconds[], foreign[], forwards[],
        prefix_len[]}], "jit": [{batch, seconds[], foreign[], forwards[]}],
        "open": [{batch, seconds[]}], "passes": n}.

    Raises:
        RuntimeError: if a build does not run exactly 1 + D forwards.
    """
    top_k = 1 if temperature < 1e-6 else -1
    base = SSDConfig(lookahead=lookahead, mode="async", fanout="geometric", beta=1.0)
    engine = SpeculatorEngine(model, base, seed=0)
    watch = stopwatch or Stopwatch()
    builds: dict[tuple[int, int, int], dict[str, Any]] = {}
    jit = {b: {"seconds": [], "foreign": [], "forwards": []} for b in batches}
    opens: dict[int, list[float]] = {b: [] for b in batches}
    rep = 0
    while rep < repeats or (
        rep < (max_repeats or repeats)
        and any(num_clean(p["foreign"]) < repeats for p in [*builds.values(), *jit.values()])
    ):
        order = list(budgets) if rep % 2 == 0 else list(budgets)[::-1]
        for b in _rotate(batches, rep):
            for depth in _rotate(depths, rep):
                rids = [f"b{b}d{depth}r{i}" for i in range(b)]
                engine.config = base.replace(tree_depth=depth, fanout_budget=order[0])
                t0 = time.perf_counter()
                for rid, prefix in zip(rids, prefixes, strict=False):
                    engine.open(rid, prefix, temperature, top_k, 1.0, seed=rep)
                opens[b].append(time.perf_counter() - t0)
                count = model.forward_count
                watch.start()
                engine.serve(rids, "jit", lookahead)
                _append(jit[b], *watch.stop())
                jit[b]["forwards"].append(model.forward_count - count)
                engine.build(rids)  # warm-up; afterwards every draft is a depth-D cache hit
                _advance(engine, rids, depth)
                for budget in order:
                    engine.config = engine.config.replace(fanout_budget=budget)
                    point = builds.setdefault(
                        (b, depth, budget),
                        {
                            "batch": b,
                            "depth": depth,
                            "budget": budget,
                            "fanout": engine.fanout(depth),
                            "seconds": [],
                            "foreign": [],
                            "forwards": [],
                            "prefix_len": [],
                        },
                    )
                    point["prefix_len"].append(len(engine.requests[rids[0]].committed))
                    count = model.forward_count
                    watch.start()
                    engine.build(rids)
                    _append(point, *watch.stop())
                    forwards = model.forward_count - count
                    point["forwards"].append(forwards)
                    if forwards != 1 + depth:
                        raise RuntimeError(f"build at D={depth} ran {forwards} forwards")
                    _advance(engine, rids, depth)
                for rid in rids:
                    engine.close(rid)
                if progress:
                    times = [builds[(b, depth, f)]["seconds"][-1] for f in budgets]
                    progress(
                        f"draft rep {rep} b={b} D={depth}: jit {jit[b]['seconds'][-1]:.3f} s, "
                        f"build {' '.join(f'{t:.3f}' for t in times)} s, "
                        f"foreign {max(builds[(b, depth, f)]['foreign'][-1] for f in budgets):.2f}"
                    )
        rep += 1
    return {
        "builds": list(builds.values()),
        "jit": [{"batch": b, **v} for b, v in jit.items()],
        "open": [{"batch": b, "seconds": v} for b, v in opens.items()],
        "passes": rep,
    }


def _append(point: dict[str, Any], seconds: float, foreign: float) -> None:
    point["seconds"].append(seconds)
    point["foreign"].append(foreign)


def num_clean(foreign: Sequence[float]) -> int:
    return sum(f <= CLEAN_FOREIGN_CORES for f in foreign)


def clean_median(seconds: Sequence[float], foreign: Sequence[float]) -> tuple[float, int]:
    """(median, n) over the clean samples when there are at least 3, else over all."""
    clean = [s for s, f in zip(seconds, foreign, strict=True) if f <= CLEAN_FOREIGN_CORES]
    use = clean if len(clean) >= 3 else list(seconds)
    return (statistics.median(use) if use else float("nan")), len(clean)


def bench_target(
    target: Any,
    prefixes: Sequence[Sequence[int]],
    batches: Sequence[int] = BATCHES,
    lookahead: int = LOOKAHEAD,
    repeats: int = 5,
    stop: Callable[[], bool] | None = None,
    temperature: float = 0.0,
    stopwatch: Stopwatch | None = None,
) -> list[dict[str, Any]]:
    """Verify timings of the target (`eval.trace.HFTarget`) for γ + 1 tokens per request.

    Each b keeps its own cache of the prefixes (all but the last token); a verify appends
    [last prefix token, γ draft tokens], calls `saguaro.verify` and crops the cache back. Runs
    at least `repeats` passes over `batches`, then until `stop()` is true.

    Returns:
        [{batch, prefix_len, seconds[], foreign[]}] (the warm-up verify of each b excluded).
    """
    length = min(len(p) for p in prefixes[: max(batches)])
    caches, inputs = {}, {}
    for b in batches:
        rows = [list(p[:length]) for p in prefixes[:b]]
        target.prefill(torch.tensor([r[:-1] for r in rows], dtype=torch.int64))
        inputs[b] = torch.tensor([[r[-1], *r[:lookahead]] for r in rows], dtype=torch.int64)
        caches[b] = target.cache
    sampling = {
        b: SamplingBatch.from_lists(
            [temperature] * b, [1 if temperature < 1e-6 else -1] * b, [1.0] * b
        )
        for b in batches
    }
    generator = torch.Generator().manual_seed(0)
    watch = stopwatch or Stopwatch()
    times: dict[int, dict[str, list[float]]] = {b: {"seconds": [], "foreign": []} for b in batches}
    passes = -1  # pass -1 is the warm-up
    while passes < repeats or (stop is not None and not stop()):
        for b in _rotate(batches, passes):
            target.cache = caches[b]
            watch.start()
            logits = target.logits(inputs[b])
            verify(logits, inputs[b][:, 1:], None, sampling[b], generator=generator)
            sample = watch.stop()
            target.rollback(length - 1)
            if passes >= 0:
                _append(times[b], *sample)
        passes += 1
    return [{"batch": b, "prefix_len": length, **times[b]} for b in batches]


# --------------------------------------------------------------------------------- processes
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
    from sglang_ssd.placement import pin_process

    pin_process([cpu])
    spec = json.loads(spec_path.read_text())
    sync_dir = spec_path.parent
    prefixes = spec["prefixes"]
    t0 = time.perf_counter()
    if role == "draft":
        model = DraftModel.load(spec["draft"], num_slots=spec["kv_slots"])
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
        from eval.trace import HFTarget

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


def summarize(draft: dict[str, Any], target: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (b, D, B): median build, verify and JIT times (over clean samples, see
    `clean_median`), T_p = build / verify, how many samples were clean, and the minima (the
    least disturbed samples: T_p_min = min build / min verify)."""
    verify = {v["batch"]: clean_median(v["seconds"], v["foreign"]) for v in target}
    jit = {j["batch"]: clean_median(j["seconds"], j["foreign"]) for j in draft["jit"]}
    verify_min = {v["batch"]: min(v["seconds"]) for v in target}
    rows = []
    for p in draft["builds"]:
        b = p["batch"]
        build, clean = clean_median(p["seconds"], p["foreign"])
        rows.append(
            {
                "batch": b,
                "depth": p["depth"],
                "budget": p["budget"],
                "fanout": p["fanout"],
                "build_s": build,
                "verify_s": verify[b][0],
                "T_p": build / verify[b][0],
                "jit_s": jit[b][0],
                "jit_over_verify": jit[b][0] / verify[b][0],
                "build_min_s": min(p["seconds"]),
                "T_p_min": min(p["seconds"]) / verify_min[b],
                "samples": len(p["seconds"]),
                "clean_samples": clean,
                "verify_samples": len(target[0]["seconds"]),
                "verify_clean_samples": verify[b][1],
                "jit_clean_samples": jit[b][1],
                "mean_prefix_len": statistics.mean(p["prefix_len"]),
            }
        )
    return sorted(rows, key=lambda r: (r["batch"], r["depth"], r["budget"]))


def format_table(rows: Sequence[dict[str, Any]], minima: bool = False) -> str:
    """Per b: verify and JIT times, then build ms (T_p) for each D (rows) and B (columns);
    `minima` shows the minimum build time and T_p_min instead of the medians."""
    build_key, tp_key = ("build_min_s", "T_p_min") if minima else ("build_s", "T_p")
    lines = []
    for b in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == b]
        budgets = sorted({r["budget"] for r in mine})
        first = mine[0]
        lines.append(
            f"b={b}: verify(γ+1) {first['verify_s'] * 1e3:.0f} ms, JIT draft (γ forwards) "
            f"{first['jit_s'] * 1e3:.0f} ms = {first['jit_over_verify']:.2f} verify"
        )
        lines.append("  D \\ B " + "".join(f"{budget:>15}" for budget in budgets))
        for depth in sorted({r["depth"] for r in mine}):
            cells = {r["budget"]: r for r in mine if r["depth"] == depth}
            lines.append(
                f"  {depth:>5} "
                + "".join(
                    f"{cells[f][build_key] * 1e3:>7.0f} ({cells[f][tp_key]:.2f})"
                    + ("*" if cells[f]["clean_samples"] < 3 and not minima else " ")
                    for f in budgets
                )
            )
    if minima:
        lines.append("build ms (T_p = build / verify), minima over all samples")
    else:
        lines.append(
            "build ms (T_p = build / verify), medians over clean samples; * = fewer than 3 clean"
            " (median of all)"
        )
    return "\n".join(lines)


def _our_cpu_s() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _wait_for_quiet(threshold: float, max_wait_s: float) -> float:
    start = time.monotonic()
    while os.getloadavg()[0] > threshold and time.monotonic() - start < max_wait_s:
        print(f"load average {os.getloadavg()[0]:.2f} > {threshold}: waiting", flush=True)
        time.sleep(30)
    return time.monotonic() - start


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m eval.bench_speculator", description=__doc__)
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
    parser.add_argument("--target", type=Path, help="target model folder (default: the 1.5B)")
    parser.add_argument("--draft", type=Path, help="draft model folder (default: the 0.5B)")
    parser.add_argument("--kv-slots", type=int, default=16384)
    parser.add_argument("--wait-load", type=float, help="wait until the 1-min load is below")
    parser.add_argument("--max-wait", type=float, default=3600.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench-speculator.json")
    parser.add_argument(
        "--resummarize", type=Path, help="recompute the summary of a results file, print it"
    )
    parser.add_argument("--worker", choices=("draft", "target"), help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.worker:
        run_worker(a.worker, a.cpu, a.spec, a.out)
        return 0
    if a.resummarize:
        report = json.loads(a.resummarize.read_text())
        report["summary"] = summarize(report["raw"]["draft"], report["raw"]["target"])
        a.resummarize.write_text(json.dumps(report, indent=1) + "\n")
        print(format_table(report["summary"]))
        print(format_table(report["summary"], minima=True))
        return 0

    from eval import datasets
    from eval.provenance import git_info, machine_info
    from eval.trace import model_info

    if a.target and a.draft:
        target_dir, draft_dir = a.target, a.draft
    else:
        from eval.configs import default_model_dirs

        target_dir, draft_dir = default_model_dirs()
    prompts = datasets.load_prompts(datasets.HUMANEVAL, datasets.load_tokenizer(target_dir), 8)
    prefixes = make_prefixes([p.input_ids for p in prompts], max(a.batches), a.prefix)
    waited = _wait_for_quiet(a.wait_load, a.max_wait) if a.wait_load else 0.0
    with tempfile.TemporaryDirectory(prefix="bench-speculator-") as tmp:
        spec_path = Path(tmp) / "spec.json"
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
        }
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        load_before = os.getloadavg()
        started, busy_before, ours_before = time.time(), machine_busy_s(), _our_cpu_s()
        procs = {
            role: subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "eval.bench_speculator",
                    "--worker",
                    role,
                    "--cpu",
                    str(cpu),
                    "--spec",
                    str(spec_path),
                    "--out",
                    str(Path(tmp) / f"{role}.json"),
                ],
                env=env,
            )
            for role, cpu in (("target", a.target_cpu), ("draft", a.draft_cpu))
        }
        codes = {role: p.wait() for role, p in procs.items()}
        busy, ours = machine_busy_s() - busy_before, _our_cpu_s() - ours_before
        load_after = os.getloadavg()
        if any(codes.values()):
            print(f"worker failed: {codes}", file=sys.stderr)
            return 1
        out = {role: json.loads((Path(tmp) / f"{role}.json").read_text()) for role in procs}
    elapsed = time.time() - started
    rows = summarize(out["draft"]["result"], out["target"]["result"])
    report = {
        "kind": "bench-speculator",
        "command": [sys.executable, "-m", "eval.bench_speculator", *argv],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "git": git_info(),
        "models": {"target": model_info(Path(target_dir)), "draft": model_info(Path(draft_dir))},
        "settings": {k: v for k, v in spec.items() if k != "prefixes"},
        "prefix_lengths": [len(p) for p in prefixes],
        "load_average_before": load_before,
        "load_average_after": load_after,
        "waited_for_quiet_s": waited,
        "elapsed_s": elapsed,
        # CPU-seconds the machine was busy while the workers ran, ours (workers + this
        # process) and everything else (other users' jobs), and the latter per second.
        "cpu": {"busy_s": busy, "ours_s": ours, "foreign_s": max(0.0, busy - ours)},
        "foreign_cores_busy_mean": max(0.0, busy - ours) / elapsed,
        "workers": {role: o["worker"] for role, o in out.items()},
        "summary": rows,
        "raw": {"draft": out["draft"]["result"], "target": out["target"]["result"]},
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    print(format_table(rows))
    print(format_table(rows, minima=True))
    print(f"load average before {load_before}, after {load_after}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The timing loops of `eval.bench_speculator`: the draft's builds and JIT drafts, the
target's verifies, each sample with the cores other processes kept busy meanwhile."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from eval.cpuload import machine_busy_s, process_cpu_s
from eval.sampling import Sampling
from sglang_ssd.config import DEFAULT_LOOKAHEAD, SSDConfig
from sglang_ssd.saguaro import verify
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine

LOOKAHEAD = DEFAULT_LOOKAHEAD  # the launcher's γ
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
    `eval.cpuload` (the kernel's 10 ms ticks). `pids` are ours: this worker and its partner.
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
        prefix_len[], phases[] (seconds by `sglang_ssd.phases` name per build)}],
        "jit": [{batch, seconds[], foreign[], forwards[]}],
        "open": [{batch, seconds[]}], "passes": n}.

    Raises:
        RuntimeError: if a build does not run exactly 1 + D forwards.
    """
    bench = _DraftBench(model, prefixes, batches, lookahead, Sampling.of(temperature), stopwatch)
    rep = 0
    while rep < repeats or (rep < (max_repeats or repeats) and bench.short_of_clean(repeats)):
        order = list(budgets) if rep % 2 == 0 else list(budgets)[::-1]
        for b in _rotate(batches, rep):
            for depth in _rotate(depths, rep):
                bench.group(rep, b, depth, order)
                if progress:
                    progress(bench.describe(rep, b, depth, budgets))
        rep += 1
    return {
        "builds": list(bench.builds.values()),
        "jit": [{"batch": b, **v} for b, v in bench.jit.items()],
        "open": [{"batch": b, "seconds": v} for b, v in bench.opens.items()],
        "passes": rep,
    }


class _DraftBench:
    """The samples of `bench_draft` so far, and how to take one group's."""

    def __init__(
        self,
        model: DraftModel,
        prefixes: Sequence[Sequence[int]],
        batches: Sequence[int],
        lookahead: int,
        sampling: Sampling,
        stopwatch: Stopwatch | None,
    ) -> None:
        self.model, self.prefixes, self.lookahead, self.sampling = (
            model, prefixes, lookahead, sampling
        )  # fmt: skip
        self.base = SSDConfig(lookahead=lookahead, mode="async", fanout="geometric", beta=1.0)
        self.engine = SpeculatorEngine(model, self.base, seed=0)
        self.watch = stopwatch or Stopwatch()
        self.builds: dict[tuple[int, int, int], dict[str, Any]] = {}
        self.jit = {b: {"seconds": [], "foreign": [], "forwards": []} for b in batches}
        self.opens: dict[int, list[float]] = {b: [] for b in batches}

    def short_of_clean(self, wanted: int) -> bool:
        """Whether some point has fewer than `wanted` clean samples."""
        points = [*self.builds.values(), *self.jit.values()]
        return any(num_clean(p["foreign"]) < wanted for p in points)

    def group(self, rep: int, b: int, depth: int, order: Sequence[int]) -> None:
        """Open b requests, time a JIT draft, warm up, then one build per budget in `order`."""
        engine, model = self.engine, self.model
        rids = [f"b{b}d{depth}r{i}" for i in range(b)]
        engine.config = self.base.replace(tree_depth=depth, fanout_budget=order[0])
        t0 = time.perf_counter()
        s = self.sampling
        for rid, prefix in zip(rids, self.prefixes, strict=False):
            engine.open(rid, prefix, s.temperature, s.top_k, s.top_p, seed=rep)
        self.opens[b].append(time.perf_counter() - t0)
        count = model.forward_count
        self.watch.start()
        engine.serve(rids, "jit", self.lookahead)
        _append(self.jit[b], *self.watch.stop())
        self.jit[b]["forwards"].append(model.forward_count - count)
        engine.build(rids)  # warm-up; afterwards every draft is a depth-D cache hit
        _advance(engine, rids, depth)
        for budget in order:
            self._build(rids, b, depth, budget)
            _advance(engine, rids, depth)
        for rid in rids:
            engine.close(rid)

    def _build(self, rids: Sequence[str], b: int, depth: int, budget: int) -> None:
        engine, model = self.engine, self.model
        engine.config = engine.config.replace(fanout_budget=budget)
        point = self.builds.setdefault(
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
                "phases": [],
            },
        )
        point["prefix_len"].append(len(engine.requests[rids[0]].committed))
        count = model.forward_count
        engine.phases.take()
        self.watch.start()
        engine.build(rids)
        _append(point, *self.watch.stop())
        point["phases"].append(engine.phases.take())
        forwards = model.forward_count - count
        point["forwards"].append(forwards)
        if forwards != 1 + depth:
            raise RuntimeError(f"build at D={depth} ran {forwards} forwards")

    def describe(self, rep: int, b: int, depth: int, budgets: Sequence[int]) -> str:
        """A progress line for the group just measured."""
        points = [self.builds[(b, depth, f)] for f in budgets]
        times = " ".join(f"{p['seconds'][-1]:.3f}" for p in points)
        return (
            f"draft rep {rep} b={b} D={depth}: jit {self.jit[b]['seconds'][-1]:.3f} s, "
            f"build {times} s, foreign {max(p['foreign'][-1] for p in points):.2f}"
        )


def _append(point: dict[str, Any], seconds: float, foreign: float) -> None:
    point["seconds"].append(seconds)
    point["foreign"].append(foreign)


def num_clean(foreign: Sequence[float]) -> int:
    return sum(f <= CLEAN_FOREIGN_CORES for f in foreign)


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
    """Verify timings of the target (`eval.trace.target.HFTarget`) for γ + 1 tokens per request.

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
    sampling = {b: Sampling.of(temperature).batch(b) for b in batches}
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

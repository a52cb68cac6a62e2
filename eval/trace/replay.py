"""Replay recorded outputs with a scripted target to measure other fan-out settings.

See `eval.trace` for what a replay can and cannot stand in for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval import cli_options
from eval.sampling import Sampling
from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine

if TYPE_CHECKING:
    from sglang_ssd.speculator.runtimes import DraftRuntime


@dataclass(frozen=True)
class ReplayConfig:
    """One fan-out setting to replay: shape, budget B and tree depth D."""

    fanout: str
    budget: int
    depth: int

    def ssd_config(self, lookahead: int) -> SSDConfig:
        return SSDConfig(
            lookahead=lookahead,
            fanout=self.fanout,  # type: ignore[arg-type]
            fanout_budget=self.budget,
            tree_depth=self.depth,
            beta=1.0,
        )


def scripted_outcome(draft: Sequence[int], remaining: Sequence[int]) -> tuple[int, int]:
    """(k, t*) forcing `remaining` (non-empty): the longest matching draft prefix, then the next
    recorded token (k stops one short of the end so that a bonus token remains)."""
    k = 0
    while k < len(draft) and k < len(remaining) - 1 and draft[k] == remaining[k]:
        k += 1
    return k, int(remaining[k])


def replay_batch(
    engine: SpeculatorEngine,
    prompts: Sequence[dict[str, Any]],
    sampling: Sampling,
    seed: int = 0,
) -> dict[str, Any]:
    """Replay trace prompts (dicts with index/input_ids/output_tokens) together as one batch.

    Returns:
        rounds, hits, hit_rate, mean_accept_length, and per prompt the replayed output tokens
        and rounds as (draft, k, bonus, source, hit) lists.
    """
    gamma = engine.config.lookahead
    todo = [p for p in prompts if p["output_tokens"]]
    pos = {p["index"]: 0 for p in todo}
    log: dict[int, list[dict[str, Any]]] = {p["index"]: [] for p in todo}
    for p in todo:
        engine.open(
            f"p{p['index']}",
            p["input_ids"],
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            seed=seed,
        )
    while todo:
        rids = [f"p{p['index']}" for p in todo]
        drafts = engine.serve(rids, "jit", gamma)
        engine.build(rids)
        outcomes = []
        for p, draft in zip(todo, drafts, strict=True):
            k, bonus = scripted_outcome(draft.tokens, p["output_tokens"][pos[p["index"]] :])
            outcomes.append(OutcomeIn(f"p{p['index']}", k, bonus))
            log[p["index"]].append(
                {
                    "draft": list(draft.tokens),
                    "accept_len": k,
                    "bonus": bonus,
                    "source": draft.source,
                }
            )
        engine.apply_outcomes(outcomes)
        for p, o in zip(todo, outcomes, strict=True):
            log[p["index"]][-1]["hit"] = engine.requests[o.rid].draft is not None
            pos[p["index"]] += o.accept_len + 1
        for p in [p for p in todo if pos[p["index"]] == len(p["output_tokens"])]:
            engine.close(f"p{p['index']}")
            todo.remove(p)
    rounds = [r for rs in log.values() for r in rs]
    n = len(rounds)
    return {
        "rounds": n,
        "hits": sum(r["hit"] for r in rounds),
        "hit_rate": sum(r["hit"] for r in rounds) / n if n else 0.0,
        "mean_accept_length": sum(r["accept_len"] + 1 for r in rounds) / n if n else 0.0,
        "prompts": {
            i: {
                "output_tokens": [
                    t for r in rs for t in [*r["draft"][: r["accept_len"]], r["bonus"]]
                ],
                "rounds": rs,
            }
            for i, rs in log.items()
        },
    }


def matches_record(trace: dict[str, Any], replayed: dict[str, Any]) -> float:
    """Fraction of recorded rounds whose (draft, k, t*, hit) the replay reproduced, in order."""
    same = 0
    for p in trace["prompts"]:
        recorded = [r for r in trace["rounds"] if r["prompt"] == p["index"]]
        mine = replayed["prompts"].get(p["index"], {"rounds": []})["rounds"]
        for a, b in zip(recorded, mine, strict=False):
            key = ("draft", "accept_len", "bonus", "hit")
            same += all(a[f] == b[f] for f in key)
    return same / max(1, len(trace["rounds"]))


def replay(
    model: DraftRuntime,
    trace: dict[str, Any],
    configs: Sequence[ReplayConfig],
    batch: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Replay `trace` under each config; one result dict per config (prompt logs omitted)."""
    sampling = Sampling(**trace["sampling"])
    gamma = int(trace["ssd_config"]["lookahead"])
    prompts = trace["prompts"]
    size = batch or len(prompts)
    results = []
    for cfg in configs:
        engine = SpeculatorEngine(model, cfg.ssd_config(gamma), seed=seed)
        t0 = time.perf_counter()
        parts = [
            replay_batch(engine, prompts[i : i + size], sampling, seed)
            for i in range(0, len(prompts), size)
        ]
        merged = {"prompts": {k: v for part in parts for k, v in part["prompts"].items()}}
        rounds = sum(p["rounds"] for p in parts)
        hits = sum(p["hits"] for p in parts)
        accepted = sum(r["accept_len"] + 1 for p in merged["prompts"].values() for r in p["rounds"])
        reproduced = all(
            merged["prompts"][p["index"]]["output_tokens"] == p["output_tokens"]
            for p in prompts
            if p["output_tokens"]
        )
        result = {
            **dataclasses.asdict(cfg),
            "trace": sampling.name,
            "rounds": rounds,
            "hits": hits,
            "hit_rate": hits / rounds if rounds else 0.0,
            "mean_accept_length": accepted / rounds if rounds else 0.0,
            "outputs_reproduced": reproduced,
            "rounds_matching_record": matches_record(trace, merged),
            "fanout_at_start": SpeculatorEngine(model, cfg.ssd_config(gamma)).fanout(cfg.depth),
            "seconds": time.perf_counter() - t0,
        }
        results.append(result)
        print(
            f"  {sampling.name:>6} {cfg.fanout:>9} B={cfg.budget:<3} D={cfg.depth}: "
            f"hit {result['hit_rate']:.3f}  L {result['mean_accept_length']:.2f}  "
            f"({rounds} rounds, {result['seconds']:.0f} s)",
            flush=True,
        )
    return results


def format_replay_table(results: Sequence[dict[str, Any]]) -> str:
    """Hit rate and mean accept length, uniform vs geometric, per trace / D / B."""
    by_key = {(r["trace"], r["depth"], r["budget"], r["fanout"]): r for r in results}
    keys = sorted({(r["trace"], -r["depth"], r["budget"]) for r in results})
    head = f"{'hit uni':>8} {'hit geo':>8} | {'L uni':>6} {'L geo':>6}"
    lines = [f"{'trace':>7} {'D':>2} {'B':>3} | {head}"]
    for trace, neg_depth, budget in keys:
        cells = []
        for metric, fmt in (("hit_rate", "{:8.3f}"), ("mean_accept_length", "{:6.2f}")):
            for shape in ("uniform", "geometric"):
                r = by_key.get((trace, -neg_depth, budget, shape))
                width = 8 if metric == "hit_rate" else 6
                cells.append(fmt.format(r[metric]) if r else " " * (width - 1) + "-")
        row = f"{cells[0]} {cells[1]} | {cells[2]} {cells[3]}"
        lines.append(f"{trace:>7} {-neg_depth:>2} {budget:>3} | {row}")
    return "\n".join(lines)


# One replay worker's state: its draft model and the traces it has read.
_WORKER: dict[str, Any] = {}


def _replay_worker_init(draft: dict[str, Any], cpus: Any) -> None:
    """Pool initializer: pin to one free core (one torch thread) and load the draft once
    (`draft`: `cli_options.load_draft`'s keyword arguments)."""
    from sglang_ssd.launch.placement import pin_process

    pin_process([cpus.get()])
    _WORKER["model"] = cli_options.load_draft(**draft)


def _replay_task(path: str, cfg: ReplayConfig, batch: int | None, seed: int) -> dict[str, Any]:
    trace = _WORKER.setdefault(path, json.loads(Path(path).read_text()))
    (result,) = replay(_WORKER["model"], trace, [cfg], batch, seed)
    return {**result, "trace_file": path, "cpus": sorted(os.sched_getaffinity(0))}


def replay_parallel(
    draft: dict[str, Any],
    tasks: Sequence[tuple[Path, ReplayConfig]],
    jobs: int,
    batch: int | None,
    seed: int,
    on_result: Callable[[dict[str, Any]], None],
) -> None:
    """Replay every (trace file, config) in `jobs` processes, each pinned to its own core with
    its own copy of the draft (`draft`: `cli_options.load_draft`'s keyword arguments);
    `on_result` gets each result as it ends."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")
    cpus = ctx.Queue()
    for cpu in sorted(os.sched_getaffinity(0))[:jobs]:
        cpus.put(cpu)
    with ProcessPoolExecutor(jobs, ctx, _replay_worker_init, (draft, cpus)) as pool:
        futures = [pool.submit(_replay_task, str(p), cfg, batch, seed) for p, cfg in tasks]
        for future in as_completed(futures):
            on_result(future.result())

"""Record SSD rounds on the real pair offline, then replay them to compare fan-out shapes.

`python -m eval.trace record` runs, in one process, the target (transformers
`AutoModelForCausalLM`, bf16, KV in a `DynamicCache`) and the speculator (`SpeculatorEngine`,
async mode, β = 1, geometric fan-out, default budget and tree depth) on HumanEval prompts. Each
round: the engine serves its draft (cache hit, or a just-in-time draft on a miss), builds the next
round's speculation cache (in the real system this overlaps the verify; here it runs before it
and is timed on its own), the target scores [root, d_1..d_D] in one forward and
`sglang_ssd.saguaro.verify` decides (k, t*) from the target's p (greedy: temperature 0 / top-k 1;
sampled: a seeded generator independent of the draft's). Every round is written to
eval/results/trace-<greedy|t0.7>.json: prompt and round index, committed length, draft source,
draft tokens, accept length k, bonus t*, whether (k, t*) was in the cache (hit), and timings.
A prompt stops at an end-of-sequence token or once it has `max_new_tokens` new tokens; the last
round is kept whole, so a prompt may end up to γ tokens past the limit.

`python -m eval.trace replay` replaces the target with a script that forces the recorded output:
for each prompt the engine is opened on the prompt, and every round k is the longest prefix of
the engine's draft that matches the recorded continuation and t* the next recorded token. The
engine's own fork/tree/populate decide whether that outcome was pre-speculated, so the cache hit
rate of any fan-out shape, budget B and tree depth D can be measured on the same outputs without
the target. The prompts of one trace are replayed as one batch (`--batch`), which changes batch
shapes and hence bf16 rounding relative to the record; `--batch 1` replays one prompt at a time.

What a replay can and cannot stand in for:
- Greedy traces replay exactly: the greedy target's outcome is a function of the draft and the
  committed tokens alone (accept while d_j equals the target's argmax, bonus the argmax), and the
  committed tokens are the recorded output whatever the draft was, so the scripted outcomes are
  the ones the real target would have produced for the replayed drafts.
- β < 1 cannot be replayed: Saguaro sampling changes the draft's q, and at T > 0 the outcome
  (accept with prob min(1, p(x)/q(x)), bonus from the residual norm(max(p - q, 0))) depends on
  q, so both the recorded outputs and the acceptance would differ; eval measures β < 1 live.
- The T = 0.7 replay is a scripted approximation: the replayed draft is a fresh sample, and the
  script accepts a draft token only when it equals the recorded token. A real target would
  accept a token that differs from the recorded one with prob min(1, p/q) and then continue a
  different (equally distributed) output, and it would draw the bonus from the residual rather
  than take the recorded token. Accept lengths are therefore pessimistic and the hit rate is
  measured on the recorded sequence's outcome distribution, not the exact one.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import SamplingBatch, verify
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine

RESULTS = Path("eval/results")
LOOKAHEAD = 4
TRACE_VERSION = 1


@dataclass(frozen=True)
class Sampling:
    """The request's sampling parameters, shared by the target's p and the draft's q."""

    temperature: float
    top_k: int = -1
    top_p: float = 1.0

    @property
    def is_greedy(self) -> bool:
        return self.top_k == 1 or self.temperature < 1e-6

    @property
    def name(self) -> str:
        """File tag: "greedy" or e.g. "t0.7"."""
        return "greedy" if self.is_greedy else f"t{self.temperature:g}"

    @classmethod
    def of(cls, temperature: float) -> Sampling:
        """Greedy (top_k 1) for temperature 0, else the whole vocabulary at `temperature`."""
        return cls(0.0, 1, 1.0) if temperature < 1e-6 else cls(float(temperature), -1, 1.0)

    def batch(self, size: int = 1) -> SamplingBatch:
        return SamplingBatch.from_lists(
            [self.temperature] * size, [self.top_k] * size, [self.top_p] * size
        )


class HFTarget:
    """The target as a transformers causal LM with a `DynamicCache` (one request or a batch).

    The cache holds every committed token except the root (the newest, not yet scored); a verify
    forward appends [root, d_1..d_D] and `rollback` cuts it back to the accepted prefix.
    """

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.cache: Any = None

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor) -> None:
        """Start a new cache holding int64 [b, n] tokens (n may be 0)."""
        from transformers import DynamicCache

        self.cache = DynamicCache()
        if tokens.shape[1] > 0:
            self.model(
                input_ids=tokens, past_key_values=self.cache, use_cache=True, logits_to_keep=1
            )

    @torch.inference_mode()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """float32 [b, n, V] logits of int64 [b, n] tokens appended to the cache."""
        out = self.model(input_ids=tokens, past_key_values=self.cache, use_cache=True)
        return out.logits.float()

    def rollback(self, length: int) -> None:
        """Keep the first `length` positions of the cache."""
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)


@dataclass
class Round:
    """One recorded round of one prompt (times in seconds)."""

    prompt: int
    round: int
    committed_len: int
    source: str
    draft: list[int]
    accept_len: int
    bonus: int
    hit: bool
    serve_s: float
    build_s: float
    verify_s: float
    apply_s: float


def record_prompt(
    target: HFTarget,
    engine: SpeculatorEngine,
    index: int,
    prompt_ids: Sequence[int],
    sampling: Sampling,
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
    seed: int = 0,
) -> tuple[list[int], list[Round]]:
    """Decode one prompt with the target verifying the engine's drafts.

    Returns:
        (the new tokens, the rounds). `hit` says whether the round's outcome (k, t*) was in the
        cache the engine built during the round, i.e. whether the next draft is a cache hit.
    """
    rid = f"p{index}"
    gamma = engine.config.lookahead
    committed = [int(t) for t in prompt_ids]
    engine.open(rid, committed, sampling.temperature, sampling.top_k, sampling.top_p, seed=seed)
    target.prefill(torch.tensor([committed[:-1]], dtype=torch.int64))
    generator = torch.Generator().manual_seed(1_000_003 * seed + index)
    rounds: list[Round] = []
    while True:
        t0 = time.perf_counter()
        (draft,) = engine.serve([rid], "jit", gamma)
        t1 = time.perf_counter()
        engine.build([rid])
        t2 = time.perf_counter()
        tokens = torch.tensor([draft.tokens], dtype=torch.int64)
        logits = target.logits(torch.tensor([[committed[-1], *draft.tokens]], dtype=torch.int64))
        q = None if draft.q is None else draft.q.unsqueeze(0)
        result = verify(logits, tokens, q, sampling.batch(), generator=generator)
        k, bonus = int(result.accept_len[0]), int(result.bonus_token[0])
        t3 = time.perf_counter()
        target.rollback(len(committed) + k)
        engine.apply_outcomes([OutcomeIn(rid, k, bonus)])
        engine.observe_accept_length(k + 1)
        hit = engine.requests[rid].draft is not None
        t4 = time.perf_counter()
        emitted = [*draft.tokens[:k], bonus]
        rounds.append(
            Round(
                index,
                len(rounds),
                len(committed),
                draft.source,
                list(draft.tokens),
                k,
                bonus,
                hit,
                t1 - t0,
                t2 - t1,
                t3 - t2,
                t4 - t3,
            )
        )
        committed += emitted
        if any(t in eos_ids for t in emitted) or len(committed) - len(prompt_ids) >= max_new_tokens:
            break
    engine.close(rid)
    return committed[len(prompt_ids) :], rounds


def summarize(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Hit rate, accept length and median timings of recorded rounds (dicts of `Round`)."""
    n = len(rounds)
    misses = [r["serve_s"] for r in rounds if r["source"] != "cache"]
    return {
        "rounds": n,
        "hit_rate": sum(r["hit"] for r in rounds) / n if n else 0.0,
        "mean_accept_length": sum(r["accept_len"] + 1 for r in rounds) / n if n else 0.0,
        "median_verify_s": statistics.median(r["verify_s"] for r in rounds) if n else None,
        "median_build_s": statistics.median(r["build_s"] for r in rounds) if n else None,
        "median_jit_s": statistics.median(misses) if misses else None,
    }


def record(
    target: HFTarget,
    engine: SpeculatorEngine,
    prompts: Sequence[Sequence[int]],
    sampling: Sampling,
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
    seed: int = 0,
) -> dict[str, Any]:
    """Record every prompt; returns the trace body (prompts with outputs, rounds, summary)."""
    if target.vocab_size != engine.vocab_size:
        raise ValueError(f"target V={target.vocab_size} != draft V={engine.vocab_size}")
    entries, rounds = [], []
    for i, ids in enumerate(prompts):
        output, prompt_rounds = record_prompt(
            target, engine, i, ids, sampling, max_new_tokens, eos_ids, seed
        )
        entries.append({"index": i, "input_ids": list(ids), "output_tokens": output})
        rounds += [dataclasses.asdict(r) for r in prompt_rounds]
        last = summarize(rounds[-len(prompt_rounds) :])
        print(
            f"  {sampling.name} prompt {i}: {len(output)} tokens in {len(prompt_rounds)} rounds, "
            f"hit rate {last['hit_rate']:.2f}, L {last['mean_accept_length']:.2f}",
            flush=True,
        )
    return {
        "sampling": dataclasses.asdict(sampling),
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "ssd_config": json.loads(engine.config.to_json()),
        "prompts": entries,
        "rounds": rounds,
        "summary": summarize(rounds),
    }


# --------------------------------------------------------------------------------- replay
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
            engine.observe_accept_length(o.accept_len + 1)
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
    model: DraftModel,
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


# --------------------------------------------------------------------------------- CLI
def model_info(path: Path) -> dict[str, Any]:
    """Path, sha256 of config.json and the pull record (GGUF sha256) of a model folder."""
    info: dict[str, Any] = {
        "path": str(path),
        "config_sha256": hashlib.sha256((path / "config.json").read_bytes()).hexdigest(),
    }
    pull = path / "sglang_ssd_pull.json"
    if pull.is_file():
        info["pull"] = json.loads(pull.read_text())
    return info


def _provenance(argv: Sequence[str]) -> dict[str, Any]:
    from eval.provenance import git_info, machine_info

    return {
        "command": [sys.executable, "-m", "eval.trace", *argv],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "git": git_info(),
    }


def _model_dirs(a: argparse.Namespace) -> tuple[Path, Path]:
    if a.target and a.draft:
        return Path(a.target), Path(a.draft)
    from eval.configs import default_model_dirs

    return default_model_dirs()


def cmd_record(a: argparse.Namespace, argv: Sequence[str]) -> int:
    from eval import datasets

    target_dir, draft_dir = _model_dirs(a)
    torch.set_num_threads(a.threads or torch.get_num_threads())
    tokenizer = datasets.load_tokenizer(target_dir)
    prompts = datasets.load_prompts(datasets.HUMANEVAL, tokenizer, a.prompts)
    target = HFTarget(target_dir)
    model = DraftModel.load(draft_dir, num_slots=a.kv_slots)
    config = SSDConfig(lookahead=a.lookahead, beta=1.0, fanout="geometric", mode="async")
    for temperature in a.temperatures:
        sampling = Sampling.of(temperature)
        engine = SpeculatorEngine(model, config, seed=a.seed)
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        body = record(
            target,
            engine,
            [p.input_ids for p in prompts],
            sampling,
            a.max_new_tokens,
            model.eos_token_ids,
            a.seed,
        )
        trace = {
            "kind": "ssd-trace",
            "version": TRACE_VERSION,
            **_provenance(argv),
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


_WORKER: dict[str, Any] = {}


def _replay_worker_init(draft_dir: str, kv_slots: int, cpus: Any) -> None:
    """Pool initializer: pin to one free core (one torch thread) and load the draft once."""
    from sglang_ssd.placement import pin_process

    pin_process([cpus.get()])
    _WORKER["model"] = DraftModel.load(draft_dir, num_slots=kv_slots)


def _replay_task(path: str, cfg: ReplayConfig, batch: int | None, seed: int) -> dict[str, Any]:
    trace = _WORKER.setdefault(path, json.loads(Path(path).read_text()))
    (result,) = replay(_WORKER["model"], trace, [cfg], batch, seed)
    return {**result, "trace_file": path, "cpus": sorted(os.sched_getaffinity(0))}


def _key(r: dict[str, Any]) -> tuple[str, str, int, int]:
    return (str(r["trace_file"]), r["fanout"], r["budget"], r["depth"])


def replay_parallel(
    draft_dir: Path,
    tasks: Sequence[tuple[Path, ReplayConfig]],
    a: argparse.Namespace,
    on_result: Callable[[dict[str, Any]], None],
) -> None:
    """Replay every (trace, config) in `a.jobs` processes, each pinned to its own core."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")
    cpus = ctx.Queue()
    for cpu in sorted(os.sched_getaffinity(0))[: a.jobs]:
        cpus.put(cpu)
    with ProcessPoolExecutor(
        a.jobs, ctx, _replay_worker_init, (str(draft_dir), a.kv_slots, cpus)
    ) as pool:
        futures = [pool.submit(_replay_task, str(p), cfg, a.batch, a.seed) for p, cfg in tasks]
        for future in as_completed(futures):
            on_result(future.result())


def cmd_replay(a: argparse.Namespace, argv: Sequence[str]) -> int:
    traces = {str(p): json.loads(Path(p).read_text()) for p in a.traces}
    first = next(iter(traces.values()))
    draft_dir = Path(a.draft) if a.draft else Path(first["models"]["draft"]["path"])
    configs = [
        ReplayConfig(shape, budget, depth)
        for depth in a.depths
        for budget in a.budgets
        for shape in a.fanouts
    ]
    results: list[dict[str, Any]] = []
    if a.resume and a.out.is_file():
        results = [r for r in json.loads(a.out.read_text())["results"] if r["batch"] == a.batch]
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
            results.append({**result, "batch": a.batch})
        report = {
            "kind": "ssd-trace-replay",
            **_provenance(argv),
            "complete": len(results) == len(done) + len(tasks),
            "draft": model_info(draft_dir),
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
        replay_parallel(draft_dir, tasks, a, save)
    else:
        torch.set_num_threads(a.threads or torch.get_num_threads())
        model = DraftModel.load(draft_dir, num_slots=a.kv_slots)
        for path, cfg in tasks:
            (result,) = replay(model, traces[str(path)], [cfg], a.batch, a.seed)
            save({**result, "trace_file": str(path)})
    save()
    print()
    print(format_replay_table(results))
    print(f"\nwrote {a.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m eval.trace",
        description=__doc__.split("\n\n")[0],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("record", help="record SSD rounds on the real pair")
    p.add_argument("--prompts", type=int, default=5, help="first N HumanEval prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    p.add_argument("--lookahead", "--gamma", type=int, default=LOOKAHEAD)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.set_defaults(func=cmd_record)
    p = sub.add_parser("replay", help="replay traces with a scripted target")
    p.add_argument(
        "--traces",
        nargs="+",
        type=Path,
        default=[RESULTS / "trace-greedy.json", RESULTS / "trace-t0.7.json"],
    )
    p.add_argument("--fanouts", nargs="+", default=["uniform", "geometric"])
    p.add_argument("--budgets", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--depths", type=int, nargs="+", default=[4, 2])
    p.add_argument("--batch", type=int, help="prompts replayed together (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="processes, one core and thread each")
    p.add_argument("--resume", action="store_true", help="keep and skip results in --out")
    p.add_argument("--out", type=Path, default=RESULTS / "trace-replay.json")
    p.set_defaults(func=cmd_replay)
    for p in sub.choices.values():
        p.add_argument("--target", type=Path, help="target model folder (default: the 1.5B)")
        p.add_argument("--draft", type=Path, help="draft model folder (default: the 0.5B)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
        p.add_argument("--kv-slots", type=int, default=16384, help="draft KV pool tokens")
    a = parser.parse_args(argv)
    return a.func(a, argv)


if __name__ == "__main__":
    sys.exit(main())

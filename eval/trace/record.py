"""Record SSD rounds: the target verifies the speculator's drafts, every round is logged.

See `eval.trace` for what a round holds and how a prompt ends.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from eval.sampling import Sampling
from eval.trace.target import HFTarget
from sglang_ssd.saguaro import verify
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine
from sglang_ssd.speculator.state import RequestState

# What a round keeps of the request's state once its next cache is built (`eval.outcomes`).
Capture = Callable[[RequestState], dict[str, Any] | None]


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
    evidence: dict[str, Any] | None = None


def record_prompt(
    target: HFTarget,
    engine: SpeculatorEngine,
    index: int,
    prompt_ids: Sequence[int],
    sampling: Sampling,
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
    seed: int = 0,
    capture: Capture | None = None,
) -> tuple[list[int], list[Round]]:
    """Decode one prompt with the target verifying the engine's drafts (`capture`, if given,
    reads the request's state once the round's cache is built into the round's `evidence`).

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
        evidence = capture(engine.requests[rid]) if capture is not None else None
        tokens = torch.tensor([draft.tokens], dtype=torch.int64)
        logits = target.logits(torch.tensor([[committed[-1], *draft.tokens]], dtype=torch.int64))
        q = None if draft.q is None else draft.q.unsqueeze(0)
        result = verify(logits, tokens, q, sampling.batch(), generator=generator)
        k, bonus = int(result.accept_len[0]), int(result.bonus_token[0])
        t3 = time.perf_counter()
        target.rollback(len(committed) + k)
        engine.apply_outcomes([OutcomeIn(rid, k, bonus)])
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
                evidence,
            )
        )
        committed += emitted
        if any(t in eos_ids for t in emitted) or len(committed) - len(prompt_ids) >= max_new_tokens:
            break
    engine.close(rid)
    return committed[len(prompt_ids) :], rounds


def add_recording_options(p: Any, prompts: int, out_dir: Any) -> None:
    """A record command's decoding options (`p`: an argparse parser): --prompts (default
    `prompts`), --max-new-tokens, --temperatures, --lookahead, --out-dir (default `out_dir`)."""
    from pathlib import Path

    from sglang_ssd.config import DEFAULT_LOOKAHEAD

    p.add_argument("--prompts", type=int, default=prompts, help="first N HumanEval prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    p.add_argument("--lookahead", "--gamma", type=int, default=DEFAULT_LOOKAHEAD)
    p.add_argument("--out-dir", type=Path, default=out_dir)


def load_recording(a: Any) -> tuple[Any, Any, list[Any], HFTarget, Any]:
    """What a record command decodes with, from its options (`a`: target, draft, threads,
    prompts, kv_slots): (target folder, draft folder, the first `a.prompts` HumanEval
    prompts, the transformers target, the draft model)."""
    from eval import datasets
    from eval.configs import model_dirs
    from sglang_ssd.speculator.draft_model import DraftModel

    target_dir, draft_dir = model_dirs(a.target, a.draft)
    torch.set_num_threads(a.threads or torch.get_num_threads())
    tokenizer = datasets.load_tokenizer(target_dir)
    prompts = datasets.load_prompts(datasets.HUMANEVAL, tokenizer, a.prompts)
    target = HFTarget(target_dir)
    model = DraftModel.load(draft_dir, num_slots=a.kv_slots)
    return target_dir, draft_dir, prompts, target, model


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
    capture: Capture | None = None,
) -> dict[str, Any]:
    """Record every prompt; returns the trace body (prompts with outputs, rounds, summary)."""
    if target.vocab_size != engine.vocab_size:
        raise ValueError(f"target V={target.vocab_size} != draft V={engine.vocab_size}")
    entries, rounds = [], []
    for i, ids in enumerate(prompts):
        output, prompt_rounds = record_prompt(
            target, engine, i, ids, sampling, max_new_tokens, eos_ids, seed, capture
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
        "sampling": sampling.verify_params(),
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "ssd_config": json.loads(engine.config.to_json()),
        "prompts": entries,
        "rounds": rounds,
        "summary": summarize(rounds),
    }

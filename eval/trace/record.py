"""Record SSD rounds: the target verifies the speculator's drafts, every round is logged.

See `eval.trace` for what a round holds and how a prompt ends.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from eval.sampling import Sampling
from eval.trace.target import HFTarget
from sglang_ssd.saguaro import verify
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine


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
        "sampling": sampling.verify_params(),
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "ssd_config": json.loads(engine.config.to_json()),
        "prompts": entries,
        "rounds": rounds,
        "summary": summarize(rounds),
    }

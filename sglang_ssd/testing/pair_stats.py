"""Measure whether a target/draft pair really speculates: greedy SSD rounds without SGLang.

`pair_stats` drives the speculator engine the way the target side does (outcome → serve →
pre-speculate → verify) with a transformers target verifying greedily, and counts what the
tests need to be able to fail: distinct output ids, accept length, cache hit rate, hits at
k < γ and at k = γ, and rounds drafted by each source. `check_pair` turns the counts into a
readable error when the pair is degenerate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sglang_ssd.config import DEFAULT_LOOKAHEAD, SSDConfig
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine
from sglang_ssd.speculator.runtimes import LoadRequest, create_draft_runtime
from sglang_ssd.testing.tiny_models import tokenize

# Code-like prompts of the kind the tiny pair was trained on (not taken from its corpus).
TYPICAL_PROMPTS = (
    "def compute_total(items, limit):~    ",
    "def merge_node(left, right):~    if left > 3:~",
    "def parse_token(batch):~    for index in range(",
    "Each draft token",
)
# Backups for cache misses, by round parity: both kinds occur in a short run.
_MISS_BACKUPS = ("jit", "ngram")


@dataclass
class PairStats:
    """What a short greedy SSD run on a pair exercised.

    Attributes:
        distinct_ids: per prompt, distinct token ids among the target's greedy output.
        rounds: verify rounds over all prompts.
        accepted: Σ accepted draft tokens (bonus excluded).
        sources: rounds by draft source (cache, jit, ngram, ...).
        hits_by_k: cache hits by the accept length k of the outcome they were cached for.
        outputs: per prompt, the emitted token ids (the target's greedy output).
        paths: (target, draft) folders measured.
    """

    distinct_ids: list[int] = field(default_factory=list)
    rounds: int = 0
    accepted: int = 0
    sources: Counter = field(default_factory=Counter)
    hits_by_k: Counter = field(default_factory=Counter)
    outputs: list[list[int]] = field(default_factory=list)
    paths: tuple[Path, Path] | None = None

    @property
    def accept_length(self) -> float:
        """Tokens per round, bonus included."""
        return 1.0 + self.accepted / max(self.rounds, 1)

    @property
    def hit_rate(self) -> float:
        return self.sources.get("cache", 0) / max(self.rounds, 1)


def _greedy_next(target: torch.nn.Module, tokens: Sequence[int]) -> torch.Tensor:
    """The target's argmax after every prefix of `tokens`: int64 [len(tokens)]."""
    with torch.inference_mode():
        return target(torch.tensor([list(tokens)])).logits[0].argmax(-1)


def _verify(target: torch.nn.Module, committed: list[int], draft: list[int]) -> tuple[int, int]:
    """Greedy verify: (k accepted, bonus token)."""
    best = _greedy_next(target, committed + draft)[len(committed) - 1 :].tolist()
    k = 0
    while k < len(draft) and draft[k] == best[k]:
        k += 1
    return k, int(best[k])


def _run_prompt(
    engine: SpeculatorEngine, target: torch.nn.Module, prompt: list[int], tokens: int
) -> tuple[list[int], PairStats]:
    stats = PairStats()
    rid = f"p{len(prompt)}"
    engine.open(rid, prompt, temperature=0.0, top_k=1, top_p=1.0)
    engine.prespeculate_first_round(rid)
    committed = list(prompt)
    outcome = OutcomeIn(rid, 0, int(_greedy_next(target, committed)[-1]))
    while len(committed) - len(prompt) < tokens:
        committed.append(outcome.bonus)
        engine.apply_outcomes([outcome])
        cached_k = outcome.accept_len
        (draft,) = engine.serve([rid], backup=_MISS_BACKUPS[stats.rounds % 2], depth=4)
        engine.build([rid])
        k, bonus = _verify(target, committed, draft.tokens)
        stats.rounds += 1
        stats.accepted += k
        stats.sources[draft.source] += 1
        if draft.source == "cache":
            stats.hits_by_k[cached_k] += 1
        committed += draft.tokens[:k]
        outcome = OutcomeIn(rid, k, bonus)
    engine.close(rid)
    return committed[len(prompt) :][:tokens], stats


def pair_stats(
    target_dir: str | Path,
    draft_dir: str | Path,
    prompts: Sequence[str] = TYPICAL_PROMPTS,
    tokens: int = 64,
    lookahead: int = DEFAULT_LOOKAHEAD,
    runtime: str = "torch",
    fanout: str = SSDConfig.fanout,
) -> PairStats:
    """Run greedy SSD rounds (γ = `lookahead`, fan-out shape `fanout`, default budget) on each
    prompt and count, the draft run by the draft runtime `runtime` (`--ssd-draft-runtime`;
    float32 where it has a dtype).

    Raises:
        ValueError: on a prompt character outside the tiny vocabulary, or an unknown runtime.
    """
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    request = LoadRequest(str(draft_dir), str(target_dir), "cpu", "float32", 8192, 0.5)
    model = create_draft_runtime(runtime, request)
    engine = SpeculatorEngine(model, SSDConfig(lookahead=lookahead, fanout=fanout), seed=0)  # type: ignore[arg-type]
    total = PairStats()
    for text in prompts:
        output, stats = _run_prompt(engine, target, tokenize(text), tokens)
        total.outputs.append(output)
        total.distinct_ids.append(len(set(output)))
        total.rounds += stats.rounds
        total.accepted += stats.accepted
        total.sources.update(stats.sources)
        total.hits_by_k.update(stats.hits_by_k)
    return total


def pair_problems(stats: PairStats, lookahead: int = DEFAULT_LOOKAHEAD) -> list[str]:
    """Why a pair cannot make SSD tests fail, or [] when it can."""
    problems = []
    if sorted(stats.distinct_ids)[len(stats.distinct_ids) // 2] < 16:
        problems.append(f"median distinct ids per output {stats.distinct_ids} < 16")
    if not 1.5 <= stats.accept_length <= lookahead:
        problems.append(f"accept length {stats.accept_length:.2f} outside [1.5, {lookahead}]")
    if not 0.2 <= stats.hit_rate <= 0.95:
        problems.append(f"cache hit rate {stats.hit_rate:.2f} outside [0.2, 0.95]")
    if not any(stats.hits_by_k[k] for k in range(lookahead)):
        problems.append(f"no cache hit at k < γ (hits by k: {dict(stats.hits_by_k)})")
    if not stats.hits_by_k[lookahead]:
        problems.append(f"no cache hit at k = γ (hits by k: {dict(stats.hits_by_k)})")
    missing = [s for s in ("cache", *_MISS_BACKUPS) if not stats.sources[s]]
    if missing:
        problems.append(f"no round drafted by {missing} (rounds: {dict(stats.sources)})")
    return problems


def check_pair(target_dir: str | Path, draft_dir: str | Path) -> PairStats:
    """`pair_stats` on the typical prompts; raises with the measured numbers if degenerate.

    Raises:
        AssertionError: listing every failed property.
    """
    stats = pair_stats(target_dir, draft_dir)
    stats.paths = (Path(target_dir), Path(draft_dir))
    problems = pair_problems(stats)
    if problems:
        raise AssertionError("the tiny pair does not really speculate: " + "; ".join(problems))
    return stats

"""Tokens per request a round of each arrangement commits, from figures the arrangements share.

Measuring each arrangement's tokens on its own rounds compares rounds from different text: a
few rounds of one arrangement on an easy passage and a few of another on a hard one, where k
swings from 0 to γ between neighbouring rounds. So the estimate is structural (the fan-out
model of docs/design.md#the-speculation-cache):

- a *chain* (a draft the draft model decoded: just in time, or a cache hit, which is the same
  chain decoded ahead) commits `chain` tokens, measured on every such draft of every
  arrangement (one moving average, so it follows the text for all of them at once);
- a sync round drafts a chain for every request: `chain`;
- an async round serves a hit with probability `hit` (measured on async rounds, from a prior)
  and a miss's backup (n-gram, random or just in time) otherwise: `hit·chain + (1-hit)·miss`;
- a plain round commits 1 token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sglang_ssd.saguaro import draft_kinds
from sglang_ssd.saguaro.averages import Ema
from sglang_ssd.worker.round_mode import Arrangement

HIT_PRIOR = 0.75  # async hit rate before measurement (B = 8, batch 1: 0.73-0.78 measured)
MISS_PRIOR = 1.2  # tokens of an async miss before measurement (an n-gram draft: k = 0.2)
# Weights of a new round: the hit rate is a mean of 0/1 outcomes, so it averages longer.
CHAIN_WEIGHT, MISS_WEIGHT, HIT_WEIGHT = 0.2, 0.3, 0.1
MODEL_SOURCES = frozenset({draft_kinds.CACHE, draft_kinds.JIT})


@dataclass
class RoundTokens:
    """The shared figures of one batch-size bucket (module docstring): tokens per request (k +
    1, bonus included) of a chain and of an async miss, and the async hit rate."""

    chain: Ema = field(default_factory=lambda: Ema(CHAIN_WEIGHT))
    miss: Ema = field(default_factory=lambda: Ema(MISS_WEIGHT, value=MISS_PRIOR))
    hit: Ema = field(default_factory=lambda: Ema(HIT_WEIGHT, value=HIT_PRIOR))

    def observe(
        self, arrangement: Arrangement, tokens: Sequence[float], sources: Sequence[str]
    ) -> None:
        """Fold in one round: `tokens` committed per request (k + 1 >= 1) and where each
        request's draft came from (`draft_kinds` names), batch order. Chains count from any
        speculative round; hits and misses from async rounds only (a sync round looks nothing
        up).

        Raises:
            ValueError: on lengths that differ or an empty round.
        """
        if len(tokens) != len(sources) or not tokens:
            raise ValueError(f"need one source per request, got {len(tokens)} / {len(sources)}")
        chains = [t for t, s in zip(tokens, sources, strict=True) if s in MODEL_SOURCES]
        if chains and arrangement != Arrangement.PLAIN:
            self.chain.add(sum(chains) / len(chains))
        if arrangement != Arrangement.ASYNC:
            return
        misses = [t for t, s in zip(tokens, sources, strict=True) if s != draft_kinds.CACHE]
        self.hit.add(1.0 - len(misses) / len(tokens))
        if misses:
            self.miss.add(sum(misses) / len(misses))

    def tokens(self, arrangement: Arrangement) -> float | None:
        """Tokens per request a round of `arrangement` commits; None for sync and async before
        a chain is measured (the hit rate and a miss's tokens start from priors)."""
        if arrangement == Arrangement.PLAIN:
            return 1.0
        chain = self.chain.value
        if chain is None:
            return None
        if arrangement == Arrangement.SYNC:
            return chain
        hit, miss = self.hit.value or 0.0, self.miss.value or MISS_PRIOR
        return hit * chain + (1.0 - hit) * miss

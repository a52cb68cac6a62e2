"""The fan-out of one round and the live statistics it comes from.

Geometric fan-out (paper Theorem 12) needs the per-token acceptance α and the exponent r of the
cache-hit power law 1 - p_hit(F) ~ c F^-r (Definition 11). Both are measured here as outcomes
arrive (docs/design.md#geometric-fan-out-theorem-12): α from the accepted tokens of drafts of any
depth (`AcceptanceCounts`:
hits carry the self-tuned D, backups γ), r by fitting the hit rate observed at each fan-out F.
A `FanoutPlan` freezes them at the start of a
round (one `serve` or `build` call), so every request and depth of that round share one plan.

The ``predicted`` shape instead allocates per request and per round from the draft's own
probabilities (`sglang_ssd.saguaro.outcome_model`, paper §4.1): the budget goes to the outcomes
(k, t) the calibrated model rates most probable, shared across the batch. Its calibration maps
learn from every verified outcome whatever the shape in force (`LiveFanout.observe_outcome`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import (
    AcceptanceCounts,
    fit_hit_counts,
    geometric_fanout,
    top_m_from_fanout,
    uniform_fanout,
)
from sglang_ssd.saguaro.outcome_model import DraftEvidence, OutcomeModel
from sglang_ssd.speculator.state import Draft, RequestState

# Exponent of the cache-hit power law until enough outcomes were observed to fit it.
DEFAULT_HIT_EXPONENT = 0.7
# A fitted r outside this range means too little or too odd data: clamp rather than trust it.
HIT_EXPONENT_RANGE = (0.2, 3.0)
# Refit r after this many new (F, hit) observations, over the most recent HIT_WINDOW of them.
REFIT_EVERY = 256
HIT_WINDOW = 4096
# A fan-out value enters the fit only with this many observations (its hit rate is a mean).
MIN_OBSERVATIONS_PER_FANOUT = 32
# Per-token acceptance assumed before any round was observed.
DEFAULT_ALPHA = 0.8
EMA_WEIGHT = 0.1
# α is kept away from 0 and 1, where geometric fan-out puts the whole budget on one outcome.
ALPHA_RANGE = (0.05, 0.98)


@dataclass
class FanoutPlan:
    """F_0..F_D per draft depth D for one round, from the α and r measured when it began.

    Attributes:
        shape: ``geometric`` (Theorem 12), ``uniform`` or ``predicted`` (per draft, from
            `outcomes`; its `fanout` is the geometric one, for Saguaro's M_j and the KV pool).
        budget: B, forked branches per request (sum of F_k; across a batch for ``predicted``).
        alpha: per-token acceptance in `ALPHA_RANGE` (unused by ``uniform``).
        hit_exponent: r of the hit model (unused by ``uniform``).
        vocab_size: V; each F_k <= V - 1.
        outcomes: the calibrated outcome model (used by ``predicted``).
    """

    shape: str
    budget: int
    alpha: float
    hit_exponent: float
    vocab_size: int
    outcomes: OutcomeModel | None = field(default=None, repr=False, compare=False)
    _by_depth: dict[int, list[int]] = field(default_factory=dict, repr=False, compare=False)

    def fanouts(self, states: Sequence[RequestState]) -> list[list[int]]:
        """F_0..F_D for the draft in flight of each state (after glue filled its candidates):
        the shape's static plan, or for ``predicted`` the most probable outcomes of the batch
        under one shared budget of B per request (one host read for the whole batch)."""
        evidence = [draft_evidence(s.draft, s.is_greedy) for s in states]
        return self.allocate(evidence, [s.draft.depth for s in states])

    def allocate(
        self, evidence: Sequence[DraftEvidence | None], depths: Sequence[int]
    ) -> list[list[int]]:
        """`fanouts` from each draft's evidence (`draft_evidence`) and depth D: the static plan
        unless ``predicted`` has the evidence of every draft."""
        if self.shape != "predicted" or self.outcomes is None or None in evidence:
            return [self.fanout(d) for d in depths]
        counts = self.outcomes.allocate(list(evidence), self.budget, shared=True)  # type: ignore[arg-type]
        return [row[: d + 1] for row, d in zip(counts.tolist(), depths, strict=True)]

    def fanout(self, depth: int) -> list[int]:
        """F_0..F_depth (depth + 1 ints >= 0) for a draft of `depth` tokens."""
        if depth not in self._by_depth:
            if self.shape == "uniform":
                plan = uniform_fanout(self.budget, depth, self.vocab_size)
            else:
                plan = geometric_fanout(
                    self.budget, depth, self.alpha, self.hit_exponent, self.vocab_size
                )
            self._by_depth[depth] = plan
        return self._by_depth[depth]

    def top_m(self, depth: int) -> list[int]:
        """M_j = F_j + 1 for the draft tokens d_1..d_depth (Saguaro sampling's top-M)."""
        return top_m_from_fanout(self.fanout(depth))

    def num_candidates(self, depth: int) -> int:
        """C = max_k F_k + 1: fork candidates kept per fork point (one may be the draft token);
        min(B, V - 1) + 1 for ``predicted``, which may put the whole budget on one k."""
        if self.shape == "predicted":
            return min(self.budget, self.vocab_size - 1) + 1
        return max(self.fanout(depth)) + 1


def draft_evidence(draft: Draft | None, greedy: bool) -> DraftEvidence | None:
    """What the outcome model reads from `draft`, or None where the draft lacks candidates or
    their probabilities (no glue yet)."""
    if draft is None or draft.candidates is None or draft.probs is None:
        return None
    if draft.token_probs is None or draft.candidates.shape != draft.probs.shape:
        return None
    # Glue pads a cached draft's candidates and their probabilities on the host (`pad_rows`)
    # while its token probabilities stay where the tree sampled them: one device for all.
    device = draft.candidates.device
    tokens = torch.tensor(draft.tokens, dtype=torch.int64, device=device)
    q_cands = None
    if draft.q is not None and not greedy and draft.depth:
        index = draft.candidates[: draft.depth].clamp_min(0).to(draft.q.device)
        q_cands = draft.q.gather(1, index).to(device)
    return DraftEvidence(
        tokens,
        draft.candidates,
        draft.probs.to(device),
        draft.token_probs.to(device),
        q_cands,
        greedy,
    )


class LiveFanout:
    """The measured α (decayed acceptance counts, `DEFAULT_ALPHA` before any outcome) and r
    (hit-model fit) behind each plan."""

    def __init__(self) -> None:
        self.acceptance = AcceptanceCounts(DEFAULT_ALPHA, 1.0, decay=EMA_WEIGHT)
        self.hit_exponent = DEFAULT_HIT_EXPONENT
        self._hits: deque[tuple[int, bool]] = deque(maxlen=HIT_WINDOW)
        self._since_fit = 0
        self.outcomes = OutcomeModel()

    @property
    def num_hit_observations(self) -> int:
        """(F, hit) observations in the fitting window."""
        return len(self._hits)

    def observe_accepted(self, accepted: int, depth: int) -> None:
        """Feed one verified draft, `accepted` of its `depth` tokens, into the counts that
        set α."""
        self.acceptance.observe([accepted], [depth])

    def observe_outcome(self, draft: Draft, greedy: bool, accept_len: int, bonus: int) -> None:
        """Calibrate the outcome model on one verified outcome (k, t*) of `draft` (drafts
        without the candidates' probabilities are skipped), at the next predicted allocation."""
        evidence = draft_evidence(draft, greedy)
        if evidence is not None and evidence.candidates.shape[0] == draft.depth + 1:
            self.outcomes.defer(evidence, accept_len, bonus)

    def observe_hit(self, fanout: int, hit: bool) -> None:
        """Record one outcome at an accept length k that had `fanout` = F_k >= 1 cached
        branches, and whether one of them was the outcome; refits r every `REFIT_EVERY`."""
        if fanout < 1:
            return  # F = 0 always misses (Definition 11): it says nothing about r
        self._hits.append((int(fanout), bool(hit)))
        self._since_fit += 1
        if self._since_fit >= REFIT_EVERY:
            self._since_fit = 0
            self.refit()

    def refit(self) -> None:
        """Fit r over the observation window; keeps the previous r without two fan-out values
        of `MIN_OBSERVATIONS_PER_FANOUT` observations each, and clamps to `HIT_EXPONENT_RANGE`.
        """
        outcomes: dict[int, int] = {}
        hits: dict[int, int] = {}
        for fanout, hit in self._hits:
            outcomes[fanout] = outcomes.get(fanout, 0) + 1
            hits[fanout] = hits.get(fanout, 0) + hit
        fitted = fit_hit_counts(outcomes, hits, MIN_OBSERVATIONS_PER_FANOUT)
        if fitted is None:
            return
        _, r = fitted
        low, high = HIT_EXPONENT_RANGE
        self.hit_exponent = min(max(r, low), high)

    def alpha(self) -> float:
        """The measured per-token acceptance, clamped to `ALPHA_RANGE`."""
        return min(max(self.acceptance.alpha, ALPHA_RANGE[0]), ALPHA_RANGE[1])

    def plan(self, config: SSDConfig, vocab_size: int) -> FanoutPlan:
        """The fan-out plan for a round under `config` (shape, budget B, γ)."""
        return FanoutPlan(
            shape=config.fanout,
            budget=config.fanout_budget,
            alpha=self.alpha(),
            hit_exponent=self.hit_exponent,
            vocab_size=vocab_size,
            outcomes=self.outcomes,
        )

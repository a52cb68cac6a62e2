"""Which outcomes (k, t) of a round to pre-speculate: predicted from the draft's own probabilities.

Each round the verifier returns an outcome (k, t): k of the draft's tokens d_1..d_D accepted,
then the bonus token t. Geometric fan-out (Theorem 12) spreads the budget B over k with one
global α. Here the outcome distribution of each draft in flight is estimated from the draft's
own numbers (paper §4.1, "pick the budgeted subset of outcomes most likely to occur"):

    P(k, t) = P(k) P(t | k),  P(k) = a_1 .. a_k (1 - a_{k+1}) (k < D),  P(D) = a_1 .. a_D

where a_j = A(p(d_j)) is the calibrated chance that d_j is accepted given its draft probability,
and P(t | k) = R(x_k(t)) (k < D) or U(x_D(t)) (k = D) calibrates a bonus feature x: the draft's
probability of t with d_{k+1} taken out, p(t) / (1 - p(d_{k+1})); for a sampled draft whose q
was shaped by Saguaro sampling (β < 1, Definition 14) the draft's share of the residual
max(p - q, 0) instead, where the bonus is drawn from on a rejection. The maps A, R, U are
bucketed frequencies learnt online from the verified outcomes (`Calibration`), one set for
greedy and one for sampled requests. The budget then goes to the most probable outcomes, per
request or across a batch that shares one budget (`select_outcomes`).

Pure torch: every tensor stays on its device, and no function reads a value back to the host.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

# Buckets of a calibration map over a feature in [0, 1].
NUM_BUCKETS = 20
# Pseudo-observations at the bucket's centre (the identity map) before any outcome.
PRIOR_WEIGHT = 4.0
# A map's counts are halved once its observations exceed this, so that it follows drift.
MAX_OBSERVATIONS = 20_000.0
# Outcomes deferred to the next allocation at most (older ones are dropped unlearnt).
MAX_DEFERRED = 1024


@dataclass
class Calibration:
    """A monotone map from a draft probability x in [0, 1] to an observed frequency.

    Bucket b covers [b / n, (b + 1) / n); its estimate is (hits + w c_b) / (trials + w) with the
    centre c_b as prior (the draft is trusted until outcomes say otherwise), made non-decreasing
    in x by weighted isotonic regression (a more confident draft is never predicted to do worse).

    Attributes:
        num_buckets: n >= 1.
        prior_weight: w > 0, pseudo-observations per bucket.
        hits / trials: float64 [n] counts (on the device of the last features seen).
    """

    num_buckets: int = NUM_BUCKETS
    prior_weight: float = PRIOR_WEIGHT
    hits: torch.Tensor = field(default=None)  # type: ignore[assignment]
    trials: torch.Tensor = field(default=None)  # type: ignore[assignment]
    _rates: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.num_buckets < 1 or not self.prior_weight > 0:
            raise ValueError(
                f"need num_buckets >= 1 and prior_weight > 0, got {self.num_buckets}, "
                f"{self.prior_weight}"
            )
        if self.hits is None:
            self.hits = torch.zeros(self.num_buckets, dtype=torch.float64)
        if self.trials is None:
            self.trials = torch.zeros(self.num_buckets, dtype=torch.float64)

    def _on(self, device: torch.device) -> None:
        if self.hits.device != device:
            self.hits, self.trials = self.hits.to(device), self.trials.to(device)
            self._rates = None

    def _bucket(self, x: torch.Tensor) -> torch.Tensor:
        return (x.double() * self.num_buckets).long().clamp(0, self.num_buckets - 1)

    def rates(self) -> torch.Tensor:
        """float64 [n]: the monotone estimate per bucket (kept until the next `observe`)."""
        if self._rates is not None:
            return self._rates
        centre = (torch.arange(self.num_buckets, dtype=torch.float64) + 0.5) / self.num_buckets
        centre = centre.to(self.hits.device)
        weight = self.trials + self.prior_weight
        raw = (self.hits + self.prior_weight * centre) / weight
        self._rates = isotonic(raw, weight)
        return self._rates

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """float32 of x's shape: the calibrated frequency at each feature value x in [0, 1]."""
        self._on(x.device)
        return self.rates()[self._bucket(x)].float()

    def observe(self, x: torch.Tensor, outcome: torch.Tensor) -> None:
        """Count observations: feature values x (any shape) and outcomes (same shape, bool or
        0/1). Halves every count once they exceed `MAX_OBSERVATIONS` (without a host sync)."""
        if x.shape != outcome.shape:
            raise ValueError(f"features {tuple(x.shape)} != outcomes {tuple(outcome.shape)}")
        self._on(x.device)
        self._rates = None
        idx = self._bucket(x.reshape(-1))
        self.trials.index_add_(0, idx, torch.ones_like(idx, dtype=torch.float64))
        self.hits.index_add_(0, idx, outcome.reshape(-1).to(torch.float64))
        scale = torch.where(self.trials.sum() > MAX_OBSERVATIONS, 0.5, 1.0).to(self.hits)
        self.hits.mul_(scale)
        self.trials.mul_(scale)


@dataclass
class DraftEvidence:
    """What the outcome model reads from one draft in flight (all on one device).

    Attributes:
        tokens: int64 [D], the draft tokens d_1..d_D (D >= 0).
        candidates: int64 [D + 1, C], per fork point k the draft's most likely next tokens,
            best first, padded with -1 (`Draft.candidates`).
        probs: float32 [D + 1, C], the draft's probability of each candidate (0 at padding).
        token_probs: float32 [D], the draft's probability of d_j where it was drawn.
        q_cands: float32 [D, C] or None: the q each d_{k+1} was sampled from (Saguaro's σ), at
            the candidates of row k; None for greedy drafts.
        greedy: whether the request is greedy (selects the calibration set).
    """

    tokens: torch.Tensor
    candidates: torch.Tensor
    probs: torch.Tensor
    token_probs: torch.Tensor
    q_cands: torch.Tensor | None
    greedy: bool

    @property
    def depth(self) -> int:
        return int(self.tokens.numel())


def bonus_features(e: DraftEvidence) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, valid), both [D + 1, C]: the bonus feature of each candidate t at each k, and whether
    (k, t) is a possible outcome (a real candidate, and not the rejected d_{k+1} at k < D).

    x = p(t) / (1 - p(d_{k+1})) at k < D, p(t) at k = D; for a sampled draft with q_cands, at
    k < D the share of the residual max(p - q, 0) among the row's candidates where that
    residual is not ~0 (β < 1; at β = 1 the draft's p equals q and the residual says nothing).

    Source: paper §4.1 (which outcomes to cache), Definition 14 (Saguaro's residual).
    """
    depth = e.depth
    valid = e.candidates >= 0
    if depth:
        rejected = e.candidates[:depth] == e.tokens.view(depth, 1)
        valid[:depth] &= ~rejected
    x = torch.where(valid, e.probs.float(), 0.0)
    if depth:
        rest = (1.0 - e.token_probs.float()).clamp_min(1e-6).view(depth, 1)
        cond = (x[:depth] / rest).clamp(0.0, 1.0)
        if e.q_cands is not None:
            residual = torch.where(valid[:depth], (x[:depth] - e.q_cands.float()).clamp_min(0), 0)
            total = residual.sum(dim=1, keepdim=True)
            share = residual / total.clamp_min(1e-12)
            cond = torch.where(total > 1e-4, share, cond)
        x = torch.cat([cond, x[depth:]])
    return x, valid


@dataclass
class CalibrationSet:
    """The three maps of one kind of request (greedy or sampled): acceptance A of a draft token
    by its draft probability, bonus R after a rejection and U after all accepted."""

    accept: Calibration = field(default_factory=Calibration)
    bonus_rejected: Calibration = field(default_factory=Calibration)
    bonus_accepted: Calibration = field(default_factory=Calibration)


@dataclass
class OutcomeModel:
    """P(k, t) for drafts in flight, calibrated online, and the budgeted choice of outcomes.

    Outcomes can be `defer`red: they are learnt at the next `allocate` (in a speculator, the
    build that overlaps the verify) rather than where they arrive (before the next draft is
    served, on the round's critical path).
    """

    greedy: CalibrationSet = field(default_factory=CalibrationSet)
    sampled: CalibrationSet = field(default_factory=CalibrationSet)
    rounds_observed: int = 0
    pending: deque[tuple[DraftEvidence, int, int]] = field(
        default_factory=lambda: deque(maxlen=MAX_DEFERRED), repr=False
    )

    def maps(self, greedy: bool) -> CalibrationSet:
        return self.greedy if greedy else self.sampled

    def outcome_probs(self, e: DraftEvidence) -> torch.Tensor:
        """float32 [D + 1, C]: P(k, t) for candidate t at row k (0 where not an outcome).

        Source: paper §4.1; the factorisation in this module's docstring.
        """
        m = self.maps(e.greedy)
        x, valid = bonus_features(e)
        depth = e.depth
        a = m.accept.predict(e.token_probs.float()) if depth else x.new_zeros(0)
        reach = torch.cat([x.new_ones(1), torch.cumprod(a, 0)])  # P(k or more accepted)
        p_k = reach - torch.cat([reach[1:], x.new_zeros(1)])  # P(exactly k)
        bonus = torch.cat(
            [m.bonus_rejected.predict(x[:depth]), m.bonus_accepted.predict(x[depth:])]
        )
        return torch.where(valid, p_k.view(-1, 1) * bonus, 0.0)

    def allocate(
        self, evidence: list[DraftEvidence], budget: int, shared: bool = True
    ) -> torch.Tensor:
        """int64 [n, K + 1]: F_k per draft (K = the deepest draft), a prefix of each row's
        valid candidates; Σ_k F_k <= B per draft, or Σ over drafts <= n B when `shared`.

        Raises:
            ValueError: on a negative budget.
        """
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        self.flush()
        if not evidence:
            return torch.zeros(0, 1, dtype=torch.int64)
        probs = pad_outcomes([self.outcome_probs(e) for e in evidence])
        return select_outcomes(probs, budget, shared).sum(dim=-1)

    def defer(self, e: DraftEvidence, accept_len: int, bonus: int) -> None:
        """`observe` at the next `allocate` (or `flush`).

        Raises:
            ValueError: when k is outside 0..D (at once, not when it is learnt).
        """
        if not 0 <= accept_len <= e.depth:
            raise ValueError(f"accept length {accept_len} outside 0..{e.depth}")
        self.pending.append((e, accept_len, bonus))

    def flush(self) -> None:
        """Learn every deferred outcome, oldest first."""
        while self.pending:
            self.observe(*self.pending.popleft())

    def observe(self, e: DraftEvidence, accept_len: int, bonus: int) -> None:
        """Fold in one verified outcome (k = `accept_len`, t = `bonus`) of the draft `e`.

        Raises:
            ValueError: when k is outside 0..D.
        """
        depth = e.depth
        if not 0 <= accept_len <= depth:
            raise ValueError(f"accept length {accept_len} outside 0..{depth}")
        m = self.maps(e.greedy)
        seen = min(accept_len + 1, depth)  # d_1..d_{k+1}: accepted, then the rejected one
        if seen:
            accepted = torch.arange(seen, device=e.token_probs.device) < accept_len
            m.accept.observe(e.token_probs[:seen].float(), accepted)
        x, valid = bonus_features(e)
        row = valid[accept_len]
        target = m.bonus_accepted if accept_len == depth else m.bonus_rejected
        target.observe(x[accept_len][row], (e.candidates[accept_len] == bonus)[row])
        self.rounds_observed += 1


def isotonic(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The non-decreasing fit of values y (float [n]) with weights w > 0 (float [n]) that
    minimises Σ w (fit - y)², in closed form: fit_i = max_{j <= i} min_{k >= i} mean_w(y_j..y_k)
    (O(n²) memory, for the few buckets of a `Calibration`; no data-dependent control flow)."""
    n = y.shape[0]
    zero = y.new_zeros(1)
    sums = torch.cat([zero, torch.cumsum(w * y, 0)])
    weights = torch.cat([zero, torch.cumsum(w, 0)])
    span = weights[None, 1:] - weights[:-1, None]  # [j, k]: weight of buckets j..k
    ordered = torch.ones(n, n, dtype=torch.bool, device=y.device).triu()  # k >= j
    means = torch.where(
        ordered, (sums[None, 1:] - sums[:-1, None]) / span.clamp_min(1e-30), torch.inf
    )
    low = torch.flip(torch.cummin(torch.flip(means, [1]), 1).values, [1])  # min over k >= i
    low = torch.where(ordered, low, -torch.inf)  # only j <= i
    return low.max(dim=0).values


def pad_outcomes(rows: list[torch.Tensor]) -> torch.Tensor:
    """Stack [D_i + 1, C_i] outcome probabilities into [n, K + 1, C] with zeros."""
    depth = max(r.shape[0] for r in rows)
    width = max(r.shape[1] for r in rows)
    out = rows[0].new_zeros(len(rows), depth, width)
    for i, r in enumerate(rows):
        out[i, : r.shape[0], : r.shape[1]] = r
    return out


def select_outcomes(probs: torch.Tensor, budget: int, shared: bool = True) -> torch.Tensor:
    """bool [n, K + 1, C]: the most probable outcomes under budget B.

    Args:
        probs: float [n, K + 1, C], P(k, t) per request (0: not an outcome, never chosen).
        budget: B >= 0 outcomes per request.
        shared: the batch shares one budget of n B (the most probable outcomes of any request
            win); otherwise each request gets its own B.

    Source: paper §4.1 (greedy: cache the budgeted subset of outcomes most likely to occur).
    """
    n = probs.shape[0]
    flat = probs.reshape(1, -1) if shared else probs.reshape(n, -1)
    take = min(budget * (n if shared else 1), flat.shape[1])
    chosen = torch.zeros_like(flat, dtype=torch.bool)
    if take > 0:
        top = torch.topk(flat, take, dim=1)
        chosen.scatter_(1, top.indices, top.values > 0)
    return chosen.view_as(probs)

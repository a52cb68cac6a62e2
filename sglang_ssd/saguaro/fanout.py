"""How many candidate bonus tokens F_k the speculator forks at each accept length k.

Geometric fan-out (paper Theorem 12, with the correction in
docs/design.md#geometric-fan-out-theorem-12): with
P(k) = alpha^k (1 - alpha) for k < gamma, P(gamma) = alpha^gamma, and the power-law hit model
1 - p_hit(F) ~ c F^(-r) (Definition 11), maximising sum_k P(k) p_hit(F_k) under sum_k F_k <= B
gives F_k proportional to P(k)^(1/(1+r)):
    F_k = F_0 alpha^(k/(1+r)) for k < gamma,
    F_gamma = F_0 alpha^(gamma/(1+r)) (1 - alpha)^(-1/(1+r)),   F_0 = B / sum_k w_k,
so F_gamma may exceed F_0. The weights are computed as P(k)^(1/(1+r)) (the same ratios), which
stays finite at alpha = 0 (all budget at k = 0) and alpha = 1 (all budget at k = gamma).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def geometric_fanout(
    budget: int, lookahead: int, alpha: float, r: float, vocab_size: int
) -> list[int]:
    """Integer fan-out F_0..F_gamma maximising the expected cache hit rate (Theorem 12).

    Args:
        budget: B >= 0, total forked branches per request (sum of F_k), e.g. 20.
        lookahead: gamma >= 0, draft tokens per round.
        alpha: per-token acceptance in [0, 1] (solve E(alpha) = L, `alpha_from_accept_length`).
            The end points are exact limits: alpha = 0 puts the budget on k = 0, alpha = 1 on
            k = gamma.
        r: hit-model exponent r > 0 (1 - p_hit(F) ~ c F^(-r), `fit_hit_model`).
        vocab_size: V >= 2; each F_k <= V - 1 (at k < gamma the rejected token cannot be the
            bonus).

    Returns:
        list of gamma + 1 ints: sum == min(budget, (V - 1) x #outcomes with P(k) > 0), each in
        [0, V - 1], non-increasing over k < gamma. Rounding is largest-remainder (ties to
        smaller k) after water-filling the V - 1 caps, so budget < gamma + 1 leaves some
        F_k = 0 (no pre-speculation for that outcome: always a miss there).

    Raises:
        ValueError: on negative budget/lookahead, alpha outside [0, 1], r <= 0 or not finite,
            or vocab_size < 2.

    Source: paper Theorem 12 and Definition 11; docs/design.md#geometric-fan-out-theorem-12.
    """
    _check_common(budget, lookahead, vocab_size)
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
        raise ValueError(f"r must be a finite float > 0, got {r!r}")
    gamma = int(lookahead)
    outcome_probs = [alpha**k * (1.0 - alpha) for k in range(gamma)] + [alpha**gamma]
    weights = [prob ** (1.0 / (1.0 + r)) for prob in outcome_probs]
    return _round_to_budget(weights, int(budget), int(vocab_size) - 1)


def uniform_fanout(budget: int, lookahead: int, vocab_size: int | None = None) -> list[int]:
    """The comparison allocation: budget split evenly over k = 0..gamma, remainder to small k.

    Args:
        budget: B >= 0. lookahead: gamma >= 0. vocab_size: optional V >= 2 capping F_k at V - 1.

    Returns:
        list of gamma + 1 ints, sum == budget (or the capped capacity), non-increasing.

    Raises:
        ValueError: on negative budget/lookahead or vocab_size < 2.

    Source: the uniform baseline that Theorem 12's geometric fan-out is compared with.
    """
    cap = None if vocab_size is None else int(vocab_size) - 1
    _check_common(budget, lookahead, 2 if vocab_size is None else vocab_size)
    return _round_to_budget([1.0] * (int(lookahead) + 1), int(budget), cap)


def hit_rate(fanout: int, c: float, r: float) -> float:
    """p_hit(F) = 1 - c F^(-r), clipped to [0, 1]; F = 0 gives 0 (Definition 11)."""
    if fanout <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - c * fanout ** (-r)))


def fit_hit_model(fanouts: Sequence[int], hit_rates: Sequence[float]) -> tuple[float, float]:
    """Fit 1 - p_hit(F) = c F^(-r) by least squares on log(1 - p_hit) = log c - r log F.

    Args:
        fanouts: F values >= 1 (at least two distinct). hit_rates: measured p_hit in [0, 1)
            at each F (values of 1 are clipped to 1 - 1e-6).

    Returns:
        (c, r); r is clipped to >= 1e-6 so that `geometric_fanout` accepts it.

    Raises:
        ValueError: on mismatched lengths, F < 1, rates outside [0, 1], or < 2 distinct F.

    Source: paper Definition 11; docs/design.md#cache-hit-model-definition-11.
    """
    if len(fanouts) != len(hit_rates) or len(set(fanouts)) < 2:
        raise ValueError("need matching fanouts/hit_rates with at least two distinct F")
    if min(fanouts) < 1 or not all(0.0 <= h <= 1.0 for h in hit_rates):
        raise ValueError("fanouts must be >= 1 and hit_rates in [0, 1]")
    xs = [math.log(f) for f in fanouts]
    ys = [math.log(max(1.0 - h, 1e-6)) for h in hit_rates]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    return math.exp(mean_y - slope * mean_x), max(-slope, 1e-6)


def fit_hit_counts(
    outcomes: Mapping[int, float], hits: Mapping[int, float], min_outcomes: int
) -> tuple[float, float] | None:
    """`fit_hit_model` on counted outcomes: F -> outcomes observed with F cached branches, F ->
    how many of them hit. Only F >= 1 with at least `min_outcomes` outcomes enter; each rate
    counts half a pseudo-miss, so that log(1 - rate) stays finite when every outcome hit.

    Returns:
        (c, r), or None with fewer than two usable F.

    Source: paper Definition 11; docs/design.md#cache-hit-model-definition-11.
    """
    usable = {f: n for f, n in outcomes.items() if f >= 1 and n >= min_outcomes}
    if len(usable) < 2:
        return None
    fanouts = sorted(usable)
    rates = [1.0 - (usable[f] - hits.get(f, 0) + 0.5) / (usable[f] + 1) for f in fanouts]
    return fit_hit_model(fanouts, rates)


def _check_common(budget: int, lookahead: int, vocab_size: int) -> None:
    for name, value, low in (
        ("budget", budget, 0),
        ("lookahead", lookahead, 0),
        ("vocab_size", vocab_size, 2),
    ):
        if isinstance(value, bool) or int(value) != value or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _round_to_budget(weights: list[float], budget: int, cap: int | None) -> list[int]:
    """Integers proportional to `weights`, each <= cap, summing to min(budget, capacity).

    Capacity is cap times the number of positive weights: outcomes of probability 0 get 0.
    """
    n = len(weights)
    positive = [k for k in range(n) if weights[k] > 0]
    total = budget if cap is None else min(budget, cap * len(positive))
    if total == 0 or not positive:
        return [0] * n
    capped: set[int] = set()
    while True:  # water-filling: pin entries above the cap, share the rest by weight
        free = [k for k in positive if k not in capped]
        left = total - (0 if cap is None else cap * len(capped))
        free_weight = sum(weights[k] for k in free)
        real = [0.0] * n
        for k in positive:
            real[k] = float(cap) if k in capped else left * weights[k] / free_weight
        over = [k for k in free if cap is not None and real[k] > cap]
        if not over:
            break
        capped.update(over)
    counts = [math.floor(x) if cap is None else min(math.floor(x), cap) for x in real]
    remainder = total - sum(counts)
    # sum(real) == total, so fewer than len(positive) units remain: one pass hands them out.
    for k in sorted(positive, key=lambda k: (-(real[k] - counts[k]), k)):
        if remainder <= 0:
            break
        if cap is None or counts[k] < cap:
            counts[k] += 1
            remainder -= 1
    return counts

"""The χ² test's power, by simulation: which biases `n` samples per prompt resolve.

A bias is a mixture (1 − ε)·p + ε·a of the reference p with an alternative law a (a direction);
its size is the mixture's total variation from p over the joint of the generated tokens, ε·TV(p,
a), averaged over the prompts. The simulation draws each prompt's merged-group counts from the
mixture (a multinomial, as a sampler with that bias would give) and runs the same statistic.

Directions (`directions`):
- "hardest" (`half_law`): scales the likelier half of p's mass up and the rest down in
  proportion, the direction of least χ² noncentrality per unit of TV;
- "toward the mode" (`mode_law`): a skew to the most likely sequence (the direction of an
  argmax-matching bug);
- "bonus from p": a verifier that draws the bonus from p instead of the residual;
- "q at T=1 in verify": a verifier that uses the draft's q at T = 1 though it sampled at T.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from eval.distribution.reference import Cells
from eval.distribution.statistic import ALPHA, merge_groups, total_variation

REPS = 10000
POWER = 0.9
# The bias the full-size run is sized for: TV 0.03 in the hardest direction at 90% power.
TARGET_TV = 0.03
# Samples per prompt of the CI test, and of the full run (`size_for_power` of the hardest
# direction at `TARGET_TV`, `POWER`; `python -m eval.distribution power --find`).
CI_SAMPLES = 2048
FULL_SAMPLES = 18944


def rejection_rate(
    laws: Sequence[np.ndarray], refs: Sequence[np.ndarray], n: int, reps: int, seed: int
) -> float:
    """Fraction of `reps` simulated runs (`n` samples per prompt from `laws`) the test rejects."""
    rng = np.random.default_rng(seed)
    statistic = np.zeros(reps)
    df = 0
    for law, ref in zip(laws, refs, strict=True):
        groups, k = _merged(ref, n)
        expected = np.bincount(groups, weights=ref, minlength=k) * n
        law_g = np.bincount(groups, weights=law, minlength=k)
        draws = rng.multinomial(n, law_g / law_g.sum(), size=reps)
        statistic += ((draws - expected) ** 2 / expected).sum(axis=1)
        df += k - 1
    return float((stats.chi2.sf(statistic, df) < ALPHA).mean())


_MERGED: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}


def _merged(ref: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """`merge_groups`, memoised per reference array (the power searches reuse a few)."""
    key = (id(ref), n)
    if key not in _MERGED or _MERGED[key][0] is not ref:
        _MERGED[key] = (ref, *merge_groups(ref, n))
    return _MERGED[key][1], _MERGED[key][2]


def mode_law(ref: np.ndarray) -> np.ndarray:
    """All mass on the most likely sequence (a sampler skewed toward argmax)."""
    law = np.zeros_like(ref)
    law[np.argmax(ref)] = 1.0
    return law


def half_law(ref: np.ndarray) -> np.ndarray:
    """p restricted to its most likely cells holding about half the mass, renormalised.

    Mixing toward it scales one half of the distribution up and the other down in proportion:
    for Pearson's χ² the direction with the least noncentrality per unit of total variation
    (λ = N·TV² / (P(A)·P(B)) ≥ 4·N·TV²), i.e. the hardest bias to see.
    """
    order = np.argsort(ref)[::-1]
    cumulative = np.cumsum(ref[order])
    size = int(np.argmin(np.abs(cumulative - 0.5))) + 1
    law = np.zeros_like(ref)
    law[order[:size]] = ref[order[:size]]
    return law / law.sum()


def directions(cells: Sequence[Cells]) -> dict[str, list[np.ndarray]]:
    """Per direction (module docstring), the alternative law of each prompt's cells."""
    refs = [c.probs["target"] for c in cells]
    return {
        "hardest": [half_law(r) for r in refs],
        "toward the mode": [mode_law(r) for r in refs],
        "bonus from p": [c.probs["bonus_from_p"] for c in cells],
        "q at T=1 in verify": [c.probs["q_at_t1"] for c in cells],
    }


def pooled_mass(ref: np.ndarray, n: int) -> float:
    """Probability in cells merged with others (a bias confined to one pool is invisible)."""
    groups, k = merge_groups(ref, n)
    sizes = np.bincount(groups, minlength=k)
    return float(ref[sizes[groups] > 1].sum())


def _mean_tv(refs: Sequence[np.ndarray], alternatives: Sequence[np.ndarray]) -> float:
    return float(np.mean([total_variation(r, a) for r, a in zip(refs, alternatives, strict=True)]))


def _mixtures(
    refs: Sequence[np.ndarray], alternatives: Sequence[np.ndarray], eps: float
) -> list[np.ndarray]:
    return [(1 - eps) * r + eps * a for r, a in zip(refs, alternatives, strict=True)]


def min_detectable_tv(
    refs: Sequence[np.ndarray],
    alternatives: Sequence[np.ndarray],
    n: int,
    reps: int = REPS,
    power: float = POWER,
) -> float:
    """Smallest TV of (1 − ε)·ref + ε·alternative (per prompt, averaged) rejected with prob ≥
    `power` at `n` samples per prompt, by bisection on ε over simulated runs (seeded)."""
    lo, hi = 0.0, 1.0
    for step in range(12):
        eps = (lo + hi) / 2
        if rejection_rate(_mixtures(refs, alternatives, eps), refs, n, reps, seed=step) >= power:
            hi = eps
        else:
            lo = eps
    return hi * _mean_tv(refs, alternatives)


def power_at_tv(
    refs: Sequence[np.ndarray],
    alternatives: Sequence[np.ndarray],
    n: int,
    tv: float,
    reps: int = REPS,
    seed: int = 0,
) -> float | None:
    """Probability that `n` samples per prompt reject a bias of size `tv` in the direction of
    `alternatives`; None if the direction holds no bias that large (ε would exceed 1)."""
    eps = tv / _mean_tv(refs, alternatives)
    if eps > 1:
        return None
    return rejection_rate(_mixtures(refs, alternatives, eps), refs, n, reps, seed)


def size_for_power(
    refs: Sequence[np.ndarray],
    alternatives: Sequence[np.ndarray],
    tv: float = TARGET_TV,
    power: float = POWER,
    reps: int = REPS,
    quantum: int = 512,
    most: int = 1 << 16,
) -> int:
    """Fewest samples per prompt (a multiple of `quantum`) that reject a bias of size `tv` in
    the direction of `alternatives` with probability ≥ `power`, by bisection over simulated
    runs (seeded); ValueError if `most` samples are not enough."""
    lo, hi = 0, most // quantum
    if (power_at_tv(refs, alternatives, hi * quantum, tv, reps) or 0.0) < power:
        raise ValueError(f"{most} samples per prompt do not resolve TV {tv} at power {power}")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (power_at_tv(refs, alternatives, mid * quantum, tv, reps) or 0.0) >= power:
            hi = mid
        else:
            lo = mid
    return hi * quantum


@dataclass(frozen=True)
class PowerRow:
    """What `samples_per_prompt` samples resolve, per direction.

    Attributes:
        df: per prompt, the χ² degrees of freedom (merged groups − 1).
        pooled_mass: per prompt, the probability in merged cells (`pooled_mass`).
        min_tv: per direction, the smallest TV rejected with probability ≥ `POWER`.
        power: per direction, the probability of rejecting TV `tv` (None: out of reach).
    """

    samples_per_prompt: int
    df: list[int]
    pooled_mass: list[float]
    min_tv: dict[str, float]
    tv: float
    power: dict[str, float | None]

    def __str__(self) -> str:
        tvs = ", ".join(f"{k}: {v:.3f}" for k, v in self.min_tv.items())
        powers = ", ".join(
            f"{k}: {'-' if v is None else f'{v:.3f}'}" for k, v in self.power.items()
        )
        return (
            f"n={self.samples_per_prompt}/prompt df={self.df} pooled mass={self.pooled_mass}\n"
            f"  TV at {POWER:.0%} power: {tvs}\n  power at TV {self.tv}: {powers}"
        )


def power_row(cells: Sequence[Cells], n: int, tv: float = TARGET_TV, reps: int = REPS) -> PowerRow:
    """The power of the test at `n` samples per prompt in every direction (seeded)."""
    refs = [c.probs["target"] for c in cells]
    families = directions(cells)
    return PowerRow(
        samples_per_prompt=n,
        df=[merge_groups(r, n)[1] - 1 for r in refs],
        pooled_mass=[round(pooled_mass(r, n), 4) for r in refs],
        min_tv={k: round(min_detectable_tv(refs, alt, n, reps), 4) for k, alt in families.items()},
        tv=tv,
        power={k: _round(power_at_tv(refs, alt, n, tv, reps)) for k, alt in families.items()},
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def broken_rejection_rates(
    cells: Sequence[Cells], broken: Sequence[str], n: int, reps: int = REPS
) -> dict[str, dict[str, object]]:
    """Per broken verifier (a law in `Cells.probs`): its TV per prompt and the probability that
    `n` samples per prompt reject it."""
    refs = [c.probs["target"] for c in cells]
    out: dict[str, dict[str, object]] = {}
    for name in broken:
        laws = [c.probs[name] for c in cells]
        out[name] = {
            "tv": [round(total_variation(r, law), 4) for r, law in zip(refs, laws, strict=True)],
            "rejection_rate": rejection_rate(laws, refs, n, reps, seed=0),
        }
    return out

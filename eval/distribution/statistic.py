"""Pearson's χ² of sampled cell counts against exact laws, with cells merged by the reference.

Each prompt's cells are merged in increasing order of probability until every group expects
≥ `MIN_EXPECTED` samples (a rule fixed by the reference and the sample count, before any data);
the statistics of the prompts are summed and rejected at `ALPHA`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 1e-3
MIN_EXPECTED = 5.0


def merge_groups(
    probs: np.ndarray, n_samples: int, min_expected: float = MIN_EXPECTED
) -> tuple[np.ndarray, int]:
    """Group index per cell (int64 [num cells]), and the number of groups, so that every group
    expects at least `min_expected` of `n_samples` samples.

    Cells are pooled in increasing order of probability until the pool reaches the threshold
    (cells above it stand alone). A last pool still short joins the group before it.
    """
    expected = probs * n_samples
    groups = np.empty(len(probs), dtype=np.int64)
    group, pooled = 0, 0.0
    for cell in np.argsort(expected, kind="stable"):
        groups[cell] = group
        pooled += expected[cell]
        if pooled >= min_expected:
            group, pooled = group + 1, 0.0
    if pooled > 0:  # a short last pool (only if the largest cell is below the threshold)
        if group == 0:
            return np.zeros(len(probs), dtype=np.int64), 1
        groups[groups == group] = group - 1
        return groups, group
    return groups, group


@dataclass(frozen=True)
class ChiSquareResult:
    """Pearson's χ² statistic, its degrees of freedom and p-value, and the sample count."""

    statistic: float
    df: int
    p_value: float
    samples: int

    @property
    def rejects(self) -> bool:
        return self.p_value < ALPHA


def chi_square(counts: Sequence[np.ndarray], refs: Sequence[np.ndarray]) -> ChiSquareResult:
    """Pearson's χ² of observed cell counts (int [num cells] per prompt) against reference laws
    (float64 [num cells] per prompt), summed over prompts.

    Each prompt's sample count is fixed by design, so df = Σ (groups − 1).
    """
    statistic, df, total = 0.0, 0, 0
    for observed, ref in zip(counts, refs, strict=True):
        n = int(observed.sum())
        groups, k = merge_groups(ref, n)
        o = np.bincount(groups, weights=observed, minlength=k)
        e = np.bincount(groups, weights=ref, minlength=k) * n
        statistic += float(((o - e) ** 2 / e).sum())
        df += k - 1
        total += n
    return ChiSquareResult(statistic, df, float(stats.chi2.sf(statistic, df)), total)


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    """Total variation distance of two laws over the same cells."""
    return 0.5 * float(np.abs(a - b).sum())

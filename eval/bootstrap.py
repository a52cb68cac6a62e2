"""A paired bootstrap interval for one configuration's speedup over another, by prompt.

A speedup is a ratio of throughputs, tokens / seconds of one configuration over another's, summed
over the prompts both ran. Prompts differ far more than repeats do (code prompts accept long
drafts, chat prompts short ones), so the unit that is resampled is the prompt: each resample
draws as many prompts as were run, with replacement, and takes the ratio of the two summed
throughputs on that draw. The interval is the central `level` share of the resampled ratios
(percentile bootstrap; Efron & Tibshirani 1993, ch. 13). The benchmark counts a goal as
met only when the interval's lower end meets it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

# (tokens, seconds) of one configuration on one prompt, summed over its repeats.
Work = tuple[float, float]

RESAMPLES = 4000
LEVEL = 0.9


def ratio_interval(
    a: Mapping[Hashable, Work],
    b: Mapping[Hashable, Work],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """The `level` percentile-bootstrap interval of throughput(a) / throughput(b) over prompts.

    Args:
        a, b: per prompt key, (tokens, seconds) of each configuration; only keys in both count.
        level: the interval's coverage in (0, 1), e.g. 0.9.
        resamples: bootstrap draws (>= 100).
        seed: numpy RNG seed, so a results file gives the same interval every time.

    Returns:
        (low, high), or None when fewer than two shared prompts have time > 0 on both sides.

    Raises:
        ValueError: `level` outside (0, 1) or `resamples` < 100.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 100:
        raise ValueError(f"resamples must be >= 100, got {resamples}")
    keys = [k for k in a if k in b and a[k][1] > 0 and b[k][1] > 0]
    if len(keys) < 2:
        return None
    work = np.array([[*a[k], *b[k]] for k in keys], dtype=np.float64)  # [P, 4]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(keys), size=(resamples, len(keys)))
    sums = work[picks].sum(axis=1)  # [R, 4]: tokens_a, seconds_a, tokens_b, seconds_b
    ratios = (sums[:, 0] / sums[:, 1]) / (sums[:, 2] / sums[:, 3])
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)


def work_by_prompt(batches: Sequence[Mapping[str, Any]], config: str) -> dict[str, Work]:
    """(tokens, seconds) per prompt id of `config` in a results file's `batches`, repeats summed.

    A batch of several requests (batch size > 1) is split over its prompts by their tokens, so
    each prompt is charged the batch's wall time in proportion to what it produced.
    """
    out: dict[str, list[float]] = {}
    for batch in batches:
        if batch["config"] != config or batch.get("error"):
            continue
        reqs = batch["requests"]
        total = sum(r["completion_tokens"] for r in reqs) or 1
        for r in reqs:
            seen = out.setdefault(r["prompt_id"], [0.0, 0.0])
            seen[0] += r["completion_tokens"]
            seen[1] += batch["wall_s"] * r["completion_tokens"] / total
    return {k: (v[0], v[1]) for k, v in out.items()}

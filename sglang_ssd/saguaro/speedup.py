"""Expected SSD decoding speed (paper Theorem 7, with the corrections of
docs/design.md#speedup-model-theorem-7).

Times are in units of one target verify. A hit round lasts max(1, T_p) (T_p = `t_spec`, the
speculator's time to build the next cache); a miss round lasts T_b + max(1, T_p) (T_b =
`t_backup`, the backup draft's latency). Per request, tokens per verify-time are
    (p_hit E_hit + (1 - p_hit) E_miss) / (p_b max(1, T_p) + (1 - p_b)(T_b + max(1, T_p)))
with E(alpha) = (1 - alpha^(gamma+1)) / (1 - alpha) and p_b = p_hit^b: the numerator is per
request (a request that hits still gets E_hit when another misses), the denominator waits for the
batch's slowest request, so a round is a miss round unless all b requests hit.
"""

from __future__ import annotations

import math

from .acceptance import expected_accept_length


def expected_speedup(
    alpha_hit: float,
    alpha_miss: float,
    lookahead: int,
    p_hit: float,
    t_spec: float,
    t_backup: float,
    batch_size: int = 1,
    t_ar_over_t_verify: float = 1.0,
    hit_lookahead: int | None = None,
) -> float:
    """Expected speedup of SSD over autoregressive decoding, per request (Theorem 7, corrected).

    Args:
        alpha_hit: per-token acceptance of drafts served from the cache, in [0, 1].
        alpha_miss: per-token acceptance of the backup drafts used on a miss, in [0, 1].
        lookahead: gamma >= 0, draft tokens per round.
        p_hit: per-request cache hit probability in [0, 1] (requests independent).
        t_spec: T_p >= 0, the speculator's time to build the next cache, in verify times.
        t_backup: T_b >= 0, the backup draft's latency on a miss, in verify times.
        batch_size: b >= 1; the batch waits for its slowest request.
        t_ar_over_t_verify: T_AR_step / T_verify (> 0): one AR step's time over one verify's.
            With 1.0 the result is tokens per request per verify time.
        hit_lookahead: draft tokens of a cache hit, the tree depth D (None: `lookahead`); a
            miss's backup draft has `lookahead` tokens.

    Returns:
        Expected tokens per request per verify time times `t_ar_over_t_verify`, i.e. the
        speedup over autoregressive decoding (which emits one token per AR step).

    Raises:
        ValueError: on probabilities outside [0, 1], negative times, batch_size < 1, or a
            non-positive `t_ar_over_t_verify`.

    Source: paper Theorem 7; docs/design.md#speedup-model-theorem-7, whose corrections are the
    per-request numerator and p_b = p_hit^b in the denominator.
    """
    for name, value in (("alpha_hit", alpha_hit), ("alpha_miss", alpha_miss), ("p_hit", p_hit)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    for name, value in (("t_spec", t_spec), ("t_backup", t_backup)):
        if not (math.isfinite(value) and value >= 0.0):
            raise ValueError(f"{name} must be a finite time >= 0 (in verify units), got {value}")
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size}")
    if not (math.isfinite(t_ar_over_t_verify) and t_ar_over_t_verify > 0.0):
        raise ValueError(f"t_ar_over_t_verify must be > 0, got {t_ar_over_t_verify}")
    e_hit = expected_accept_length(alpha_hit, lookahead if hit_lookahead is None else hit_lookahead)
    e_miss = expected_accept_length(alpha_miss, lookahead)
    tokens = p_hit * e_hit + (1.0 - p_hit) * e_miss
    p_all_hit = p_hit ** int(batch_size)
    hidden = max(1.0, t_spec)
    round_time = p_all_hit * hidden + (1.0 - p_all_hit) * (t_backup + hidden)
    return tokens / round_time * t_ar_over_t_verify

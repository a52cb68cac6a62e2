"""Which requests the speculator's KV pool can hold this round, and how much prefill to feed.

The pool is sized from the target's capacity (`SSDConfig.draft_kv_slots`), but shared prompt
prefixes (one radix-cache entry on the target, one copy per request here) and live fan-out
changes can still overrun it. The speculator never lets an allocation fail: before a batched
forward it admits requests in batch order while their slots fit (`admit`), and the others get a
backup draft or skip pre-speculation for that round. Prefill is fed in chunks (`prefill_plan`),
so a long prompt never holds up the other requests' drafts.
"""

from __future__ import annotations

from collections.abc import Sequence


def admit(needs: Sequence[int], free: int) -> list[bool]:
    """Admit requests in order while their slots fit; a request that does not fit is skipped
    and later, smaller ones may still fit.

    Args:
        needs: KV slots each request needs (≥ 0).
        free: slots free in the pool.

    Returns:
        Per request, whether it was admitted (the admitted needs sum to at most `free`).
    """
    admitted = []
    for need in needs:
        ok = need <= free
        if ok:
            free -= need
        admitted.append(ok)
    return admitted


def prefill_plan(backlogs: Sequence[int], budget: int, free: int) -> list[int]:
    """Tokens of prefill to feed per request in one chunk, in the order given.

    Args:
        backlogs: unfed tokens each request has before its root (≥ 0).
        budget: at most this many tokens in all (the chunk size).
        free: slots free in the pool (each fed token takes one).

    Returns:
        Per request, tokens to feed now (≤ its backlog; the sum ≤ min(budget, free)).
    """
    left = max(min(budget, free), 0)
    plan = []
    for backlog in backlogs:
        n = min(backlog, left)
        left -= n
        plan.append(n)
    return plan

"""The one input check every branch-attention plan runs before its kernel: shapes, dtypes and
devices of q and the paged KV cache against the plan's row count and largest slot.

Its own module so that both `branch_attention` (torch SDPA) and `flashinfer_branch` import it
without importing each other.
"""

from __future__ import annotations

import torch

__all__ = ["check_run_inputs"]


def check_run_inputs(
    num_queries: int,
    max_slot: int,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> None:
    """Raise ValueError unless q [N, H, d], k_cache [S, Hkv, d] and v_cache [S, Hkv, dv] fit a
    plan of `num_queries` rows whose largest slot is `max_slot` (same dtype and device)."""
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.dim() != 3:
        raise ValueError("q, k_cache and v_cache must be 3-D: [N, H, d], [S, Hkv, d], [S, Hkv, dv]")
    if q.shape[0] != num_queries:
        raise ValueError(f"q has {q.shape[0]} rows but the layout describes {num_queries}")
    if k_cache.shape[:2] != v_cache.shape[:2] or k_cache.shape[2] != q.shape[2]:
        raise ValueError(f"cache shapes {tuple(k_cache.shape)} / {tuple(v_cache.shape)} vs q")
    if q.shape[1] % k_cache.shape[1] != 0:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k_cache.shape[1]}")
    if q.dtype != k_cache.dtype or q.dtype != v_cache.dtype:
        raise ValueError(f"dtype mismatch: q {q.dtype}, k {k_cache.dtype}, v {v_cache.dtype}")
    if q.device != k_cache.device or q.device != v_cache.device:
        raise ValueError(f"device mismatch: q {q.device}, cache {k_cache.device}")
    if max_slot >= k_cache.shape[0]:
        raise ValueError(f"slot {max_slot} out of range for a cache of {k_cache.shape[0]}")

"""Branch attention through FlashInfer's paged prefill: planned once per forward, run per layer.

The SSD speculator's tree decode on CUDA (DESIGN.md section 1, step 2: "reusing FlashInfer paged
attention for cached-branch decoding"). The layout is the one `branch_attention` documents
(FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` with page_size = 1, NHD, `custom_mask`), so
the plan passes it to FlashInfer unchanged but for two things FlashInfer does not take:
- segments with no query rows are dropped (their mask blocks are empty, their slots unread);
- a segment with queries but no slot cannot be expressed (FlashInfer needs kv_len >= 1), so
  `flashinfer_supports_layout` says no and `plan_branch_attention` plans SDPA instead.

`plan` is host work (FlashInfer copies the index pointers to pinned memory and splits the work)
and happens at the first `run`, since the softmax scale is a plan argument of FlashInfer's and
the caller passes it per layer; every later layer with the same scale reuses it, as SGLang's
FlashInfer backend does (`layers/attention/flashinfer_backend.py`: `init_forward_metadata` plans,
each layer's `forward_extend` runs). FlashInfer's own limits (fp16/bf16, head dim in
`FLASHINFER_HEAD_DIMS`) are checked at that first run; outside them the plan runs the padded
SDPA plan of the same layout instead (one SDPA call over all segments, no per-request loop).

Imports with torch alone; flashinfer is imported when a wrapper is made.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang_ssd_kernels.branch_inputs import check_run_inputs

__all__ = [
    "FLASHINFER_HEAD_DIMS",
    "FlashInferBranchPlan",
    "flashinfer_available",
    "flashinfer_supports_layout",
    "plan_flashinfer_branch",
]

# Head dims FlashInfer 0.7's prefill kernels are built for; other head dims run the SDPA plan.
FLASHINFER_HEAD_DIMS = (64, 128, 256)
_WORKSPACE_BYTES = 128 * 1024 * 1024
_WORKSPACES: dict[torch.device, torch.Tensor] = {}


@functools.cache
def flashinfer_available() -> bool:
    """True when the flashinfer package imports (it needs CUDA only at run time); cached."""
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


def flashinfer_supports_layout(qo_lens: list[int], kv_lens: list[int]) -> bool:
    """False when some segment has query rows but no slot (FlashInfer needs kv_len >= 1)."""
    return all(kv > 0 for qo, kv in zip(qo_lens, kv_lens, strict=True) if qo > 0)


def make_wrapper(device: torch.device) -> Any:
    """A `flashinfer.BatchPrefillWithPagedKVCacheWrapper` (NHD) on `device`'s shared workspace.

    Raises:
        RuntimeError: if flashinfer cannot be imported or `device` is not a CUDA device.
    """
    try:
        import flashinfer
    except ImportError as error:
        raise RuntimeError("FlashInfer branch attention needs the flashinfer package") from error
    if device.type != "cuda":
        raise RuntimeError(f"FlashInfer branch attention needs a CUDA device, got {device}")
    workspace = _WORKSPACES.get(device)
    if workspace is None:
        workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _WORKSPACES[device] = workspace
    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")


@dataclass
class FlashInferBranchPlan:
    """One forward's layout for FlashInfer; `run` has `BranchAttentionPlan.run`'s contract.

    Build with `plan_flashinfer_branch`. Attributes:
        num_queries: N, the query rows of the forward (all segments, empty ones included).
        max_slot: the largest cache slot referenced (-1 if none).
        qo_indptr, kv_indptr: int32 [R' + 1] over the R' segments that have query rows.
        kv_indices: int32 [total_kv'] their slots.
        custom_mask: bool [sum qo * kv] or None, blocks of those segments.
        empty_rows: int64 [E] query rows that see no slot (zeroed after the kernel), or None.
        sdpa: builds the padded SDPA plan of the same layout (used outside FlashInfer's limits).
        plans: FlashInfer `plan` calls so far (one per forward expected).

    The wrapper comes from this module's `make_wrapper`, looked up at the first run.
    """

    num_queries: int
    max_slot: int
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None
    empty_rows: torch.Tensor | None
    sdpa: Callable[[], Any]
    _wrapper: Any = None
    _planned: tuple | None = None  # (sm_scale, q dtype, kv dtype, H, Hkv, d, dv) last planned
    _fallback: Any = None
    plans: int = 0

    def run(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sm_scale: float
    ) -> torch.Tensor:
        """Attend `q` over the planned slots (see `BranchAttentionPlan.run`).

        Args:
            q: [N, H, d] fp16/bf16 on CUDA; k_cache: [S, Hkv, d]; v_cache: [S, Hkv, dv].
            sm_scale: softmax scale; a different scale than the last run's re-plans.

        Returns:
            [N, H, dv] in q's dtype; rows that see no slot are zero.

        Raises:
            ValueError: on shape, dtype or device mismatches, or a slot index >= S.
        """
        check_run_inputs(self.num_queries, self.max_slot, q, k_cache, v_cache)
        if self._fallback is not None or not _kernel_supports(q, k_cache, v_cache):
            if self._fallback is None:
                self._fallback = self.sdpa()
            return self._fallback.run(q, k_cache, v_cache, sm_scale)
        key = (sm_scale, q.dtype, k_cache.dtype, q.shape[1], k_cache.shape[1], q.shape[2],
               v_cache.shape[2])  # fmt: skip
        if self._planned != key:
            self._plan(q, k_cache, v_cache, sm_scale)
            self._planned = key
        out = self._wrapper.run(q.contiguous(), (k_cache.unsqueeze(1), v_cache.unsqueeze(1)))
        if self.empty_rows is not None:
            out.index_fill_(0, self.empty_rows, 0.0)
        return out

    def _plan(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sm_scale: float
    ) -> None:
        """FlashInfer's `plan` for this layout at q's heads, dims and dtypes (host work)."""
        if self._wrapper is None:
            self._wrapper = make_wrapper(q.device)
        head_dim, dv = q.shape[2], v_cache.shape[2]
        extra = {} if dv == head_dim else {"head_dim_vo": dv}
        self._wrapper.plan(
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            torch.ones(self.qo_indptr.numel() - 1, dtype=torch.int32, device=q.device),
            q.shape[1],
            k_cache.shape[1],
            head_dim,
            1,  # page_size: one slot per page
            custom_mask=self.custom_mask,
            causal=False,
            sm_scale=sm_scale,
            q_data_type=q.dtype,
            kv_data_type=k_cache.dtype,
            **extra,
        )
        self.plans += 1


def _kernel_supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """FlashInfer's prefill limits: fp16/bf16 and a head dim it is built for (the device is
    checked where the wrapper is made)."""
    return (
        q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[2] in FLASHINFER_HEAD_DIMS
        and v_cache.shape[2] in FLASHINFER_HEAD_DIMS
    )


def plan_flashinfer_branch(
    qo_ptr: list[int],
    kv_ptr: list[int],
    slots: torch.Tensor,
    max_slot: int,
    mask: torch.Tensor | None,
    empty_rows: torch.Tensor | None,
    sdpa: Callable[[], Any],
) -> FlashInferBranchPlan:
    """Drop the segments without query rows and keep the rest for FlashInfer's `plan`.

    Args:
        qo_ptr, kv_ptr: the layout's index pointers as host lists [R + 1] (validated).
        slots: int64 [total_kv] on the cache's device; max_slot: their largest (-1 if none),
            as the caller already read it; mask: bool [sum qo * kv] or None.
        empty_rows: int64 [E] rows that see no slot, or None.
        sdpa: builds the same layout's padded SDPA plan (see `FlashInferBranchPlan.sdpa`).

    Returns:
        A `FlashInferBranchPlan` (nothing planned with FlashInfer yet: that is the first run).
    """
    device = slots.device
    kept = [r for r in range(len(qo_ptr) - 1) if qo_ptr[r + 1] > qo_ptr[r]]
    qo_lens = [qo_ptr[r + 1] - qo_ptr[r] for r in kept]
    kv_lens = [kv_ptr[r + 1] - kv_ptr[r] for r in kept]
    if len(kept) == len(qo_ptr) - 1:
        kv_indices = slots
    else:
        positions = [j for r in kept for j in range(kv_ptr[r], kv_ptr[r + 1])]
        kv_indices = slots[torch.tensor(positions, dtype=torch.int64, device=device)]
    return FlashInferBranchPlan(
        num_queries=qo_ptr[-1],
        max_slot=max_slot,
        qo_indptr=_indptr(qo_lens, device),
        kv_indptr=_indptr(kv_lens, device),
        kv_indices=kv_indices.to(torch.int32),
        custom_mask=mask,
        empty_rows=empty_rows,
        sdpa=sdpa,
    )


def _indptr(lens: list[int], device: torch.device) -> torch.Tensor:
    """int32 [len(lens) + 1]: 0 then the running sum of `lens`."""
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)

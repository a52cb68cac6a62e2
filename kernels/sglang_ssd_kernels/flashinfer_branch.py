"""Branch attention through FlashInfer's paged prefill: planned once per forward, run per layer.

The SSD speculator's tree decode on CUDA (docs/design.md#one-round, step 2: "reusing FlashInfer
paged
attention for cached-branch decoding"). The layout is the one `branch_attention` documents
(FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` with page_size = 1, NHD, `custom_mask`), so
the plan passes it to FlashInfer unchanged but for two things FlashInfer does not take:
- segments with no query rows are dropped (their mask blocks are empty, their slots unread);
- a segment with queries but no slot cannot be expressed (FlashInfer needs kv_len >= 1), so
  `flashinfer_supports_layout` says no and `plan_branch_attention` plans SDPA instead.

`plan` is host work (FlashInfer reads the index pointers on the host and splits the work) and
happens at the first `run`, since the softmax scale is a plan argument of FlashInfer's and the
caller passes it per layer; every later layer with the same scale reuses it, as SGLang's
FlashInfer backend does (`layers/attention/flashinfer_backend.py`: `init_forward_metadata` plans,
each layer's `forward_extend` runs). FlashInfer's own limits (fp16/bf16, head dim in
`FLASHINFER_HEAD_DIMS`) are checked at that first run; outside them the plan runs the padded
SDPA plan of the same layout instead (one SDPA call over all segments, no per-request loop).

One wrapper per device, made once with its 128 MiB workspace (`wrapper_for`); each forward's
plan re-plans it, since kv_indptr changes every forward. The index pointers are built on the
host (`host_indptr`): FlashInfer's `plan` reads `qo_indptr`, `paged_kv_indptr` and
`paged_kv_last_page_len` with `.to("cpu")` (`flashinfer/prefill.py`,
`BatchPrefillWithPagedKVCacheWrapper.plan`: "only required if qo_indptr/paged_kv_indptr are
device tensors") and copies them to its device buffers with `non_blocking=True`, so host index
pointers cost no device sync. Before FlashInfer 0.7 its custom-mask packing needed `qo_indptr`
on the mask's device (`segment_packbits` with the mask indptr on qo_indptr's device), so there
a masked plan passes it on the device (`qo_indptr_device`).

Imports with torch alone; flashinfer is imported when a wrapper is made.
"""

from __future__ import annotations

import functools
import itertools
import re
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
    "host_indptr",
    "plan_flashinfer_branch",
    "wrapper_for",
]

# Head dims FlashInfer 0.7's prefill kernels are built for; other head dims run the SDPA plan.
FLASHINFER_HEAD_DIMS = (64, 128, 256)
_WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass
class DeviceWrapper:
    """A device's FlashInfer wrapper and the plan it holds now.

    Attributes:
        wrapper: the `BatchPrefillWithPagedKVCacheWrapper` (`make_wrapper`).
        planned_by: the `FlashInferBranchPlan` whose layout it was last planned for, or None.
        key: that plan's (sm_scale, dtypes, heads, dims) it was planned at, or None.
    """

    wrapper: Any
    planned_by: Any = None
    key: tuple | None = None


_WRAPPERS: dict[torch.device, DeviceWrapper] = {}


def wrapper_for(device: torch.device) -> DeviceWrapper:
    """`device`'s wrapper, made at its first use (`make_wrapper`) and kept for the process.

    Raises:
        RuntimeError: from `make_wrapper` (no flashinfer, or not a CUDA device).
    """
    entry = _WRAPPERS.get(device)
    if entry is None:
        entry = _WRAPPERS[device] = DeviceWrapper(make_wrapper(device))
    return entry


@functools.cache
def qo_indptr_device() -> bool:
    """Whether a masked plan must pass qo_indptr on the mask's device (FlashInfer < 0.7)."""
    import flashinfer

    found = re.match(r"(\d+)\.(\d+)", getattr(flashinfer, "__version__", "0.0"))
    return found is None or (int(found[1]), int(found[2])) < (0, 7)


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
    """A new `flashinfer.BatchPrefillWithPagedKVCacheWrapper` (NHD) with its own workspace on
    `device` (`wrapper_for` keeps one per device).

    Raises:
        RuntimeError: if flashinfer cannot be imported or `device` is not a CUDA device.
    """
    try:
        import flashinfer
    except ImportError as error:
        raise RuntimeError("FlashInfer branch attention needs the flashinfer package") from error
    if device.type != "cuda":
        raise RuntimeError(f"FlashInfer branch attention needs a CUDA device, got {device}")
    workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")


@dataclass
class FlashInferBranchPlan:
    """One forward's layout for FlashInfer; `run` has `BranchAttentionPlan.run`'s contract.

    Build with `plan_flashinfer_branch`. Attributes:
        num_queries: N, the query rows of the forward (all segments, empty ones included).
        max_slot: the largest cache slot referenced (-1 if none).
        qo_indptr, kv_indptr: int32 [R' + 1] on the CPU, over the R' segments that have query
            rows (`host_indptr`).
        kv_indices: int32 [total_kv'] their slots.
        custom_mask: bool [sum qo * kv] or None, blocks of those segments.
        empty_rows: int64 [E] query rows that see no slot (zeroed after the kernel), or None.
        sdpa: builds the padded SDPA plan of the same layout (used outside FlashInfer's limits).
        plans: FlashInfer `plan` calls so far (one per forward expected).

    The wrapper is the device's (`wrapper_for`), looked up at each run: re-planned when another
    plan (another forward, or another model) planned it since, or at another scale or shape.
    """

    num_queries: int
    max_slot: int
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None
    empty_rows: torch.Tensor | None
    sdpa: Callable[[], Any]
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
        entry = wrapper_for(q.device)
        if entry.planned_by is not self or entry.key != key:
            self._plan(entry.wrapper, q, k_cache, v_cache, sm_scale)
            entry.planned_by, entry.key = self, key
        out = entry.wrapper.run(q.contiguous(), (k_cache.unsqueeze(1), v_cache.unsqueeze(1)))
        if self.empty_rows is not None:
            out.index_fill_(0, self.empty_rows, 0.0)
        return out

    def _plan(
        self,
        wrapper: Any,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        sm_scale: float,
    ) -> None:
        """FlashInfer's `plan` of `wrapper` for this layout at q's heads, dims and dtypes (host
        work; the index pointers and last-page lengths go from the host)."""
        head_dim, dv = q.shape[2], v_cache.shape[2]
        extra = {} if dv == head_dim else {"head_dim_vo": dv}
        qo_indptr = self.qo_indptr
        if self.custom_mask is not None and qo_indptr_device():
            qo_indptr = qo_indptr.to(self.custom_mask.device)
        wrapper.plan(
            qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            torch.ones(self.qo_indptr.numel() - 1, dtype=torch.int32),  # page_size 1: 1 each
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
        qo_indptr=host_indptr(qo_lens),
        kv_indptr=host_indptr(kv_lens),
        kv_indices=kv_indices.to(torch.int32),
        custom_mask=mask,
        empty_rows=empty_rows,
        sdpa=sdpa,
    )


def host_indptr(lens: list[int]) -> torch.Tensor:
    """int32 [len(lens) + 1] on the CPU: 0 then the running sum of `lens` (segment lengths,
    read from the host lists the plan already has: no device read)."""
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)

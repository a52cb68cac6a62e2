"""Branch attention: batched attention over a slot-paged KV cache with a per-request custom mask.

This is the attention the SSD speculator needs for tree decode (docs/design.md#one-round, step 2):
one
forward decodes many branches of many requests, and each branch token sees only the committed
prefix, the glue tokens up to its fork depth and its own earlier branch tokens.

Layout (FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` with `page_size=1` and `custom_mask`):
- R segments, one per request. Segment r owns the queries `q[qo_indptr[r]:qo_indptr[r + 1]]`
  (qo_len_r rows) and the keys/values at cache slots `kv_indices[kv_indptr[r]:kv_indptr[r + 1]]`
  (kv_len_r slots, in that order).
- `custom_mask` is bool, the concatenation over r of a row-major [qo_len_r, kv_len_r] block:
  entry (i, j) is True when query i of segment r may attend to the segment's j-th slot. None means
  every query sees every slot of its segment.
- GQA by head grouping: query head h reads KV head h // (H / Hkv) (HF's `repeat_kv`).
- A query that sees no slot outputs zeros (defined here; callers should not rely on what
  FlashInfer returns for such a row).

`plan_branch_attention` does the host-side work once (it reads the index pointers, builds gather
indices and padded masks) and the returned plan's `run` is called once per layer: the draft model
plans once per forward and reuses the plan across all its layers. `branch_attention` is plan + run.
On a CUDA device with flashinfer installed the plan is FlashInfer's paged prefill
(`flashinfer_branch`); elsewhere torch's SDPA, on CUDA always in one padded call (no Python loop
over requests). `dense_reference` is the slow, obviously-correct float64 reference the tests
compare against; `branch_attention_flashinfer` forces FlashInfer (CUDA only, imported lazily).

This module imports with torch alone.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from sglang_ssd_kernels.branch_inputs import check_run_inputs
from sglang_ssd_kernels.flashinfer_branch import (
    FlashInferBranchPlan,
    flashinfer_available,
    flashinfer_supports_layout,
    plan_flashinfer_branch,
)

Strategy = Literal["auto", "padded", "segments"]
Backend = Literal["auto", "flashinfer", "sdpa"]

__all__ = [
    "BranchAttentionPlan",
    "branch_attention",
    "branch_attention_flashinfer",
    "causal_custom_mask",
    "check_run_inputs",
    "dense_mask_from_layout",
    "dense_reference",
    "plan_branch_attention",
]


@dataclass
class BranchAttentionPlan:
    """Precomputed gather indices and masks for one layout; `run` is called once per layer.

    Build it with `plan_branch_attention`. Two execution strategies, same result:
    - "padded": every segment is padded to (max qo_len, max kv_len) and all run in one SDPA call;
      best for many short segments (tree decode over several requests).
    - "segments": one SDPA call per segment, no padding; best for few, very uneven segments.

    Attributes:
        num_queries: N, the number of query rows the layout describes.
        strategy: "padded" or "segments".
        max_slot: the largest cache slot referenced (-1 if none); `run` checks it against S.
    """

    num_queries: int
    strategy: str
    max_slot: int
    # "padded": R, padded sizes, gather indices, mask [R, 1, max_qo, max_kv].
    num_segments: int = 0
    max_qo: int = 0
    max_kv: int = 0
    kv_gather: torch.Tensor | None = None  # int64 [R * max_kv]
    q_gather: torch.Tensor | None = None  # int64 [R * max_qo] into q with a zero row appended
    out_rows: torch.Tensor | None = None  # int64 [N] into the padded [R * max_qo] output
    mask: torch.Tensor | None = None  # bool [R, 1, max_qo, max_kv] or None
    # "segments": (q_start, q_end, kv slots int64 [kv_len], mask bool [1, 1, qo, kv] or None).
    segments: list[tuple[int, int, torch.Tensor, torch.Tensor | None]] = field(default_factory=list)
    empty_rows: torch.Tensor | None = None  # int64 [E]: query rows that see no slot
    _grouped_masks: dict[tuple[int, int], torch.Tensor | None] = field(default_factory=dict)

    def run(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        sm_scale: float,
    ) -> torch.Tensor:
        """Attend `q` over the planned slots of `k_cache` / `v_cache`.

        Args:
            q: float [N, H, d] (any strides), N equal to the planned number of queries.
            k_cache: float [S, Hkv, d], the same dtype and device as q; H % Hkv == 0.
            v_cache: float [S, Hkv, dv].
            sm_scale: softmax scale applied to q·k (usually d ** -0.5).

        Returns:
            float [N, H, dv] in q's dtype, on q's device.

        Raises:
            ValueError: on shape, dtype or device mismatches, or a slot index >= S.
        """
        check_run_inputs(self.num_queries, self.max_slot, q, k_cache, v_cache)
        if self.strategy == "padded":
            out = self._run_padded(q, k_cache, v_cache, sm_scale)
        else:
            out = self._run_segments(q, k_cache, v_cache, sm_scale)
        if self.empty_rows is not None:
            out.index_fill_(0, self.empty_rows, 0.0)
        return out

    def _grouped_mask(self, mask: torch.Tensor | None, key: int, group: int) -> torch.Tensor | None:
        """`mask` [R, 1, qo, kv] repeated for `group` query heads per KV head: [R, 1, g*qo, kv].

        Query heads that share a KV head are folded into the query-row dimension, so SDPA runs
        with Hkv heads and K/V are never repeated (about 6x faster than `enable_gqa` for bf16
        decode on CPU). Cached per (segment, group): built once per forward, not per layer.
        """
        if mask is None or group == 1:
            return mask
        cached = self._grouped_masks.get((key, group))
        if cached is None:
            r, _, qo, kv = mask.shape
            cached = mask.expand(r, group, qo, kv).reshape(r, 1, group * qo, kv)
            self._grouped_masks[(key, group)] = cached
        return cached

    def _run_padded(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sm_scale: float
    ) -> torch.Tensor:
        heads, d = q.shape[1], q.shape[2]
        kv_heads, dv = k_cache.shape[1], v_cache.shape[2]
        group = heads // kv_heads
        r, max_qo, max_kv = self.num_segments, self.max_qo, self.max_kv
        if self.q_gather is None:  # one segment: no padding, q is used as is
            q_pad = q.unsqueeze(0)  # [1, N, H, d]
        else:
            q_ext = torch.cat([q, q.new_zeros(1, heads, d)])
            q_pad = q_ext.index_select(0, self.q_gather).view(r, max_qo, heads, d)
        # [R, qo, H, d] -> [R, Hkv, g * qo, d]: head h = kv_head * g + j (HF repeat_kv order).
        q_grouped = (
            q_pad.reshape(r, max_qo, kv_heads, group, d)
            .permute(0, 2, 3, 1, 4)
            .reshape(r, kv_heads, group * max_qo, d)
        )
        k = k_cache.index_select(0, self.kv_gather).view(r, max_kv, kv_heads, d).transpose(1, 2)
        v = v_cache.index_select(0, self.kv_gather).view(r, max_kv, kv_heads, dv).transpose(1, 2)
        mask = self._grouped_mask(self.mask, -1, group)
        o = F.scaled_dot_product_attention(q_grouped, k, v, attn_mask=mask, scale=sm_scale)
        # [R, Hkv, g * qo, dv] -> [R * qo, H, dv]
        o = (
            o.view(r, kv_heads, group, max_qo, dv)
            .permute(0, 3, 1, 2, 4)
            .reshape(r * max_qo, heads, dv)
        )
        return o if self.out_rows is None else o.index_select(0, self.out_rows)

    def _run_segments(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sm_scale: float
    ) -> torch.Tensor:
        n, heads, d = q.shape
        kv_heads, dv = k_cache.shape[1], v_cache.shape[2]
        group = heads // kv_heads
        out = q.new_zeros(n, heads, dv)
        for index, (start, end, slots, mask) in enumerate(self.segments):
            qo = end - start
            q_grouped = (q[start:end].reshape(qo, kv_heads, group, d).permute(1, 2, 0, 3)).reshape(
                1, kv_heads, group * qo, d
            )
            k = k_cache.index_select(0, slots).transpose(0, 1).unsqueeze(0)
            v = v_cache.index_select(0, slots).transpose(0, 1).unsqueeze(0)
            seg_mask = self._grouped_mask(mask, index, group)
            o = F.scaled_dot_product_attention(q_grouped, k, v, attn_mask=seg_mask, scale=sm_scale)
            out[start:end] = (
                o.view(kv_heads, group, qo, dv).permute(2, 0, 1, 3).reshape(qo, heads, dv)
            )
        return out


def plan_branch_attention(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    device: torch.device | str | None = None,
    strategy: Strategy = "auto",
    backend: Backend = "auto",
) -> BranchAttentionPlan | FlashInferBranchPlan:
    """Validate a layout and precompute everything `run` needs (host work, once per forward).

    Args:
        qo_indptr: int32/int64 [R + 1], non-decreasing from 0; segment r's queries are rows
            qo_indptr[r]:qo_indptr[r + 1].
        kv_indptr: int32/int64 [R + 1], non-decreasing from 0, last entry == len(kv_indices).
        kv_indices: int32/int64 [total_kv], cache slots (>= 0) of every segment in order.
        custom_mask: bool [sum_r qo_len_r * kv_len_r] (row-major block per segment) or None
            (full visibility).
        device: where the plan's index/mask tensors live (the KV cache's device); default
            kv_indices' device.
        strategy: SDPA's execution: "padded", "segments" or "auto" (on CUDA always padded, one
            SDPA call for the whole batch; on the CPU padded unless padding would more than
            double the attention area of several uneven segments).
        backend: "flashinfer" (FlashInfer's paged prefill, `flashinfer_branch`), "sdpa" (torch's
            scaled_dot_product_attention) or "auto": FlashInfer on a CUDA device where the
            flashinfer package imports and every segment with queries has a slot, else SDPA.

    Returns:
        A `BranchAttentionPlan` (SDPA) or a `FlashInferBranchPlan`; both have `run`.

    Raises:
        ValueError: on malformed index pointers, negative slots, a mask of the wrong size/dtype,
            an unknown backend, or "flashinfer" for a segment with queries and no slot.
    """
    qo_ptr, kv_ptr = _check_layout(qo_indptr, kv_indptr, kv_indices, custom_mask)
    device = torch.device(device) if device is not None else kv_indices.device
    qo_lens, kv_lens = _segment_lens(qo_ptr), _segment_lens(kv_ptr)
    slots = kv_indices.to(device=device, dtype=torch.int64)
    mask = None if custom_mask is None else custom_mask.to(device=device)
    max_slot = int(slots.max()) if slots.numel() > 0 else -1
    num_queries = qo_ptr[-1]

    visible = _visible_counts(mask, qo_lens, kv_lens, device)
    empty = (visible == 0).nonzero().squeeze(1)
    empty_rows = empty if empty.numel() > 0 else None

    if _choose_backend(backend, device, qo_lens, kv_lens) == "flashinfer":
        return plan_flashinfer_branch(
            qo_ptr,
            kv_ptr,
            slots,
            max_slot,
            mask,
            empty_rows,
            sdpa=lambda: plan_branch_attention(
                qo_indptr, kv_indptr, kv_indices, custom_mask, device, "padded", "sdpa"
            ),
        )
    strategy = _choose_strategy(strategy, qo_lens, kv_lens, device)
    plan = BranchAttentionPlan(
        num_queries=num_queries, strategy=strategy, max_slot=max_slot, empty_rows=empty_rows
    )
    if num_queries == 0 or max(kv_lens, default=0) == 0:
        plan.strategy = "segments"  # nothing to attend: run returns zeros
    elif strategy == "segments":
        _plan_segments(plan, qo_ptr, kv_ptr, slots, mask)
    else:
        _plan_padded(plan, qo_ptr, kv_ptr, slots, mask)
    return plan


def _choose_backend(
    backend: Backend, device: torch.device, qo_lens: list[int], kv_lens: list[int]
) -> str:
    """Resolve "auto" (FlashInfer on CUDA where it imports and takes the layout) and check."""
    if backend not in ("auto", "flashinfer", "sdpa"):
        raise ValueError(f"unknown backend {backend!r}; expected 'auto', 'flashinfer' or 'sdpa'")
    fits = flashinfer_supports_layout(qo_lens, kv_lens)
    if backend == "flashinfer" and not fits:
        raise ValueError("FlashInfer needs every segment with query rows to have a slot")
    if backend == "auto":
        on_cuda = device.type == "cuda" and flashinfer_available()
        return "flashinfer" if on_cuda and fits else "sdpa"
    return backend


def _choose_strategy(
    strategy: Strategy, qo_lens: list[int], kv_lens: list[int], device: torch.device
) -> str:
    """Resolve "auto": on CUDA padded (one kernel launch set, no per-segment Python loop); on
    the CPU padded unless padding would more than double the attention area."""
    if strategy == "auto" and device.type == "cuda":
        strategy = "padded"
    if strategy == "auto":
        num_segments = len(qo_lens)
        area = sum(qo * kv for qo, kv in zip(qo_lens, kv_lens, strict=True))
        padded_area = num_segments * max(qo_lens, default=0) * max(kv_lens, default=0)
        strategy = "padded" if num_segments <= 1 or padded_area <= 2 * area + 4096 else "segments"
    if strategy not in ("padded", "segments"):
        raise ValueError(f"unknown strategy {strategy!r}; expected 'auto', 'padded' or 'segments'")
    return strategy


def _plan_segments(
    plan: BranchAttentionPlan,
    qo_ptr: list[int],
    kv_ptr: list[int],
    slots: torch.Tensor,
    mask: torch.Tensor | None,
) -> None:
    """Fill `plan.segments`: one (q rows, slots, mask block) per non-empty segment."""
    offset = 0
    for r in range(len(qo_ptr) - 1):
        qo, kv = qo_ptr[r + 1] - qo_ptr[r], kv_ptr[r + 1] - kv_ptr[r]
        if qo == 0 or kv == 0:
            offset += qo * kv
            continue
        seg_slots = slots[kv_ptr[r] : kv_ptr[r + 1]]
        seg_mask = None
        if mask is not None:
            seg_mask = mask[offset : offset + qo * kv].view(1, 1, qo, kv)
        plan.segments.append((qo_ptr[r], qo_ptr[r + 1], seg_slots, seg_mask))
        offset += qo * kv


def _plan_padded(
    plan: BranchAttentionPlan,
    qo_ptr: list[int],
    kv_ptr: list[int],
    slots: torch.Tensor,
    mask: torch.Tensor | None,
) -> None:
    """Fill the padded fields of `plan`: gather indices into q and the cache, and the mask."""
    device = slots.device
    num_segments, num_queries = len(qo_ptr) - 1, qo_ptr[-1]
    qo_lens, kv_lens = _segment_lens(qo_ptr), _segment_lens(kv_ptr)
    max_qo, max_kv = max(qo_lens), max(kv_lens)
    plan.num_segments, plan.max_qo, plan.max_kv = num_segments, max_qo, max_kv
    qo_len_t = torch.tensor(qo_lens, dtype=torch.int64, device=device)
    kv_len_t = torch.tensor(kv_lens, dtype=torch.int64, device=device)
    q_pos = torch.arange(max_qo, device=device)
    kv_pos = torch.arange(max_kv, device=device)
    q_valid = q_pos.unsqueeze(0) < qo_len_t.unsqueeze(1)  # [R, max_qo]
    kv_valid = kv_pos.unsqueeze(0) < kv_len_t.unsqueeze(1)  # [R, max_kv]
    kv_start = torch.tensor(kv_ptr[:-1], dtype=torch.int64, device=device)
    gather = (kv_start.unsqueeze(1) + kv_pos.unsqueeze(0)).clamp_(max=max(len(slots) - 1, 0))
    # Padding slots read slot kv_indices[last] (a valid slot) and are masked out.
    plan.kv_gather = slots[gather].reshape(-1)
    if num_segments > 1:
        q_start = torch.tensor(qo_ptr[:-1], dtype=torch.int64, device=device)
        q_rows = q_start.unsqueeze(1) + q_pos.unsqueeze(0)
        plan.q_gather = torch.where(q_valid, q_rows, num_queries).reshape(-1)
        plan.out_rows = q_valid.reshape(-1).nonzero().squeeze(1)
    if mask is None and all(kv == max_kv for kv in kv_lens):
        plan.mask = None
        return
    dense = torch.zeros(num_segments, max_qo, max_kv, dtype=torch.bool, device=device)
    if mask is None:
        dense |= kv_valid.unsqueeze(1)
    else:
        block = q_valid.unsqueeze(2) & kv_valid.unsqueeze(1)  # [R, max_qo, max_kv]
        dense[block] = mask  # row-major per segment == boolean-index order
    plan.mask = dense.unsqueeze(1)


def branch_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    sm_scale: float,
    strategy: Strategy = "auto",
    backend: Backend = "auto",
) -> torch.Tensor:
    """Batched masked attention over a slot-paged KV cache (plan + run; see the module docstring).

    Args:
        q: float [N, H, d].
        k_cache: float [S, Hkv, d], H % Hkv == 0, same dtype/device as q.
        v_cache: float [S, Hkv, dv].
        qo_indptr: int32/int64 [R + 1], qo_indptr[-1] == N.
        kv_indptr: int32/int64 [R + 1].
        kv_indices: int32/int64 [total_kv], slots in [0, S).
        custom_mask: bool [sum_r qo_len_r * kv_len_r] or None (full visibility).
        sm_scale: softmax scale.
        strategy, backend: see `plan_branch_attention`.

    Returns:
        float [N, H, dv] in q's dtype; rows that see no slot are zero.

    Raises:
        ValueError: on a malformed layout or inconsistent shapes/dtypes/devices.
    """
    plan = plan_branch_attention(
        qo_indptr, kv_indptr, kv_indices, custom_mask, q.device, strategy, backend
    )
    return plan.run(q, k_cache, v_cache, sm_scale)


def causal_custom_mask(
    qo_lens: list[int], kv_lens: list[int], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Flat custom mask for causal append: each segment's queries are its last qo_len slots.

    Query i of segment r sits at slot position kv_len_r - qo_len_r + i and sees slot positions
    0..kv_len_r - qo_len_r + i (FlashInfer's `causal=True` convention for append attention).

    Args:
        qo_lens: per-segment query counts, each <= the matching kv_len.
        kv_lens: per-segment KV lengths.
        device: device of the result.

    Returns:
        bool [sum_r qo_len_r * kv_len_r].

    Raises:
        ValueError: if the lists differ in length or some qo_len > kv_len.
    """
    if len(qo_lens) != len(kv_lens):
        raise ValueError(f"{len(qo_lens)} qo_lens vs {len(kv_lens)} kv_lens")
    blocks = []
    for qo, kv in zip(qo_lens, kv_lens, strict=True):
        if qo > kv or qo < 0:
            raise ValueError(f"causal append needs 0 <= qo_len <= kv_len, got {qo} > {kv}")
        rows = torch.arange(qo, device=device).unsqueeze(1) + (kv - qo)
        blocks.append((torch.arange(kv, device=device).unsqueeze(0) <= rows).reshape(-1))
    if not blocks:
        return torch.zeros(0, dtype=torch.bool, device=device)
    return torch.cat(blocks)


def dense_mask_from_layout(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    num_slots: int,
) -> torch.Tensor:
    """The [N, S] visibility matrix a layout describes (for `dense_reference`).

    Slots within one segment must be distinct (a repeated slot would count twice in the paged
    softmax but once in the dense one).

    Returns:
        bool [N, num_slots] on kv_indices' device.

    Raises:
        ValueError: on a malformed layout, a slot >= num_slots or a repeated slot in a segment.
    """
    qo_ptr, kv_ptr = _check_layout(qo_indptr, kv_indptr, kv_indices, custom_mask)
    device = kv_indices.device
    dense = torch.zeros(qo_ptr[-1], num_slots, dtype=torch.bool, device=device)
    offset = 0
    for r in range(len(qo_ptr) - 1):
        qo, kv = qo_ptr[r + 1] - qo_ptr[r], kv_ptr[r + 1] - kv_ptr[r]
        slots = kv_indices[kv_ptr[r] : kv_ptr[r + 1]].to(torch.int64)
        if kv and (int(slots.max()) >= num_slots or slots.unique().numel() != kv):
            raise ValueError(f"segment {r}: slots must be distinct and < {num_slots}")
        block = torch.ones(qo, kv, dtype=torch.bool, device=device)
        if custom_mask is not None:
            block = custom_mask[offset : offset + qo * kv].view(qo, kv).to(device)
        dense[qo_ptr[r] : qo_ptr[r + 1]].index_copy_(1, slots, block)
        offset += qo * kv
    return dense


def dense_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    dense_mask: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Slow reference: every query against every cache slot, masked by a dense [N, S] matrix.

    Computed in float64 with an explicit softmax; a row with no visible slot outputs zeros.

    Args:
        q: float [N, H, d]; k_cache: float [S, Hkv, d]; v_cache: float [S, Hkv, dv].
        dense_mask: bool [N, S], True where query n may attend to slot s.
        sm_scale: softmax scale.

    Returns:
        float [N, H, dv] in q's dtype.
    """
    heads, kv_heads = q.shape[1], k_cache.shape[1]
    group = heads // kv_heads
    k = k_cache.double().repeat_interleave(group, dim=1)  # [S, H, d]
    v = v_cache.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,shd->hns", q.double(), k) * sm_scale
    scores = scores.masked_fill(~dense_mask.unsqueeze(0), float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all -inf rows -> 0
    return torch.einsum("hns,shd->nhd", weights, v).to(q.dtype)


def branch_attention_flashinfer(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    sm_scale: float,
) -> torch.Tensor:
    """The same attention through FlashInfer's `BatchPrefillWithPagedKVCacheWrapper`.

    `plan_branch_attention(..., backend="flashinfer")` and its `run`: page_size = 1, NHD layout
    (the cache viewed as [S, 1, Hkv, d] pages), `custom_mask` passed to FlashInfer's `plan`.
    FlashInfer's own limits apply: CUDA, fp16/bf16, head_dim in {64, 128, 256} (outside the
    last two the padded SDPA plan runs instead), every segment with queries has kv_len >= 1.

    Returns:
        [N, H, dv] in q's dtype.

    Raises:
        RuntimeError: if flashinfer cannot be imported or the tensors are not on CUDA.
        ValueError: on a malformed layout (see `plan_branch_attention`).
    """
    plan = plan_branch_attention(
        qo_indptr, kv_indptr, kv_indices, custom_mask, device=q.device, backend="flashinfer"
    )
    return plan.run(q, k_cache, v_cache, sm_scale)


def _check_layout(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
) -> tuple[list[int], list[int]]:
    """Validate the index pointers; return them as Python lists (one host sync)."""
    for name, tensor in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1 or tensor.numel() < 1:
            raise ValueError(f"{name} must be a 1-D integer tensor [R + 1]")
        if tensor.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be int32 or int64, got {tensor.dtype}")
    if qo_indptr.numel() != kv_indptr.numel():
        raise ValueError(
            f"qo_indptr has {qo_indptr.numel()} entries, kv_indptr {kv_indptr.numel()}"
        )
    if kv_indices.dim() != 1 or kv_indices.dtype not in (torch.int32, torch.int64):
        raise ValueError("kv_indices must be a 1-D int32/int64 tensor")
    qo_ptr, kv_ptr = qo_indptr.tolist(), kv_indptr.tolist()
    for name, ptr in (("qo_indptr", qo_ptr), ("kv_indptr", kv_ptr)):
        if ptr[0] != 0 or any(b < a for a, b in itertools.pairwise(ptr)):
            raise ValueError(f"{name} must start at 0 and be non-decreasing, got {ptr}")
    if kv_ptr[-1] != kv_indices.numel():
        raise ValueError(f"kv_indptr[-1] = {kv_ptr[-1]} but kv_indices has {kv_indices.numel()}")
    if kv_indices.numel() > 0 and int(kv_indices.min()) < 0:
        raise ValueError("kv_indices must be >= 0")
    if custom_mask is not None:
        expected = sum(
            (qo_ptr[r + 1] - qo_ptr[r]) * (kv_ptr[r + 1] - kv_ptr[r])
            for r in range(len(qo_ptr) - 1)
        )
        if custom_mask.dtype != torch.bool or custom_mask.dim() != 1:
            raise ValueError(f"custom_mask must be a 1-D bool tensor, got {custom_mask.dtype}")
        if custom_mask.numel() != expected:
            raise ValueError(f"custom_mask has {custom_mask.numel()} entries, expected {expected}")
    return qo_ptr, kv_ptr


def _segment_lens(indptr: list[int]) -> list[int]:
    """Per-segment lengths of an index pointer [R + 1]: indptr[r + 1] - indptr[r] for each r."""
    return [end - start for start, end in itertools.pairwise(indptr)]


def _visible_counts(
    mask: torch.Tensor | None, qo_lens: list[int], kv_lens: list[int], device: torch.device
) -> torch.Tensor:
    """int64 [N]: how many slots each query row sees."""
    per_row = torch.tensor(
        [kv for qo, kv in zip(qo_lens, kv_lens, strict=True) for _ in range(qo)],
        dtype=torch.int64,
        device=device,
    )
    if mask is None or mask.numel() == 0:
        return per_row
    # Row id of every mask entry, then a scatter-add of the True entries.
    row_ids = torch.repeat_interleave(torch.arange(per_row.numel(), device=device), per_row)
    return torch.zeros_like(per_row).index_add_(0, row_ids, mask.to(torch.int64))

"""KV-slot bookkeeping ops: `req_to_token` reads/writes and raw KV row moves.

`req_to_token` is SGLang's `[max_num_reqs, pool_len]` int32 map from (request slot, token
position) to a KV-pool row; "cache locs" are int64 KV-pool rows. Every op works on a batch of
variable-length segments `[start_offset[i], end_offset[i])` of request `req_pool_indices[i]`,
flattened in batch order, as the Triton kernels beside each call site do.
"""

from __future__ import annotations

import ctypes

import torch


def segment_coords(
    start_offset: torch.Tensor, end_offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten per-request ranges `[start_offset[i], end_offset[i])` in batch order.

    Args:
        start_offset: `[bs]` int32/int64.
        end_offset: `[bs]` same shape; `end_offset >= start_offset`.

    Returns:
        `(seg, col)`, both `[sum(end - start)]` int64: the batch row of each element and its
        position inside that row's range.

    Raises:
        RuntimeError: a range has negative length.
    """
    start = start_offset.reshape(-1).to(torch.int64)
    lens = end_offset.reshape(-1).to(torch.int64) - start
    seg = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    first = torch.cumsum(lens, 0) - lens
    col = start[seg] + torch.arange(seg.numel(), device=lens.device) - first[seg]
    return seg, col


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write freshly allocated slots into `req_to_token` (in place).

    `req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]` receives the next
    `end_offset[i] - start_offset[i]` entries of `out_cache_loc`, requests in batch order.

    Args:
        req_pool_indices: `[bs]` int32/int64.
        req_to_token: `[max_num_reqs, pool_len]` int32; written.
        start_offset: `[bs]` int32/int64.
        end_offset: `[bs]` int32/int64.
        out_cache_loc: `[>= sum(end - start)]` int64 KV rows.
        pool_len: `req_to_token.shape[1]`.

    Raises:
        ValueError: `pool_len` disagrees with `req_to_token`, or `out_cache_loc` is too short.
    """
    op = "assign_req_to_token_pool_cpu"
    rows, col = _segment_slots(
        op, req_to_token, pool_len, req_pool_indices, start_offset, end_offset, out_cache_loc
    )
    req_to_token[rows, col] = out_cache_loc.reshape(-1)[: rows.numel()].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather each request's slots `[start_offset[i], end_offset[i])` into `out_cache_loc`.

    Args:
        req_pool_indices: `[bs]` int32/int64.
        req_to_token: `[max_num_reqs, pool_len]` int32 (any integer dtype).
        start_offset: `[bs]` int32/int64.
        end_offset: `[bs]` int32/int64.
        out_cache_loc: `[>= sum(end - start)]` int64; the first `sum(end - start)` entries are
            written, the tail is left alone (callers size it at capacity).
        pool_len: `req_to_token.shape[1]`.

    Raises:
        ValueError: `pool_len` disagrees with `req_to_token`, or `out_cache_loc` is too short.
    """
    op = "assign_extend_cache_locs_cpu"
    rows, col = _segment_slots(
        op, req_to_token, pool_len, req_pool_indices, start_offset, end_offset, out_cache_loc
    )
    out_cache_loc.view(-1)[: rows.numel()] = req_to_token[rows, col].to(out_cache_loc.dtype)


def _segment_slots(
    op: str,
    req_to_token: torch.Tensor,
    pool_len: int,
    req_pool_indices: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`req_to_token` coordinates `(rows, col)`, both int64 `[sum(end - start)]`, of the segments.

    Raises:
        ValueError: `pool_len` disagrees with `req_to_token`, or `out_cache_loc` has fewer
            entries than the segments (the message names `op`).
    """
    _check_pool_len(req_to_token, pool_len, op)
    seg, col = segment_coords(start_offset, end_offset)
    if seg.numel() > out_cache_loc.numel():
        raise ValueError(
            f"{op}: out_cache_loc has {out_cache_loc.numel()} entries, "
            f"the offsets need {seg.numel()}"
        )
    return req_pool_indices.reshape(-1).to(torch.int64)[seg], col


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Read back the `topk * num_steps` draft slots reserved after each request's prefix.

    `out_cache_loc[i * topk * num_steps + j] = req_to_token[req_pool_indices[i], seq_lens[i] + j]`.

    Args:
        req_pool_indices: `[bs]` int32/int64.
        req_to_token: `[max_num_reqs, pool_len]` int32.
        seq_lens: `[bs]` int32/int64, committed prefix lengths.
        out_cache_loc: `[bs * topk * num_steps]` int64; written.
        pool_len: `req_to_token.shape[1]`.
        topk: draft branches per request.
        num_steps: draft steps per branch.

    Raises:
        ValueError: shapes disagree.
    """
    _check_pool_len(req_to_token, pool_len, "assign_draft_cache_locs_contiguous_cpu")
    bs = req_pool_indices.numel()
    width = topk * num_steps
    if out_cache_loc.numel() != bs * width:
        raise ValueError(
            f"assign_draft_cache_locs_contiguous_cpu: out_cache_loc has {out_cache_loc.numel()} "
            f"entries, expected bs * topk * num_steps = {bs * width}"
        )
    cols = seq_lens.reshape(-1, 1).to(torch.int64) + torch.arange(width)
    rows = req_pool_indices.reshape(-1, 1).to(torch.int64)
    out_cache_loc.view(bs, width)[:] = req_to_token[rows, cols]


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Expand `req_to_token` to one row per draft branch for multi-step draft decode.

    Row `b * topk + k` holds request `b`'s committed prefix (`seq_lens[b]` slots) followed by
    branch `k`'s `num_steps` draft slots, which `assign_draft_cache_locs_contiguous` laid out at
    `seq_lens[b] + k * num_steps` (so for `topk == 1` the row is the request's row).

    Args:
        req_to_token: `[max_num_reqs, pool_len]` int32.
        req_pool_indices: `[num_seqs]` int32/int64.
        seq_lens: `[num_seqs]` int32/int64.
        topk: draft branches per request.
        num_steps: draft steps per branch.
        pool_len: `req_to_token.shape[1]`.

    Returns:
        `[num_seqs * topk, pool_len]` int32; entries past `seq_lens[b] + num_steps` are copies
        of the request row (the caller never reads them).
    """
    _check_pool_len(req_to_token, pool_len, "build_draft_decode_metadata_cpu")
    rows = req_to_token[req_pool_indices.reshape(-1).to(torch.int64)]
    expanded = rows.repeat_interleave(topk, dim=0)
    if topk > 1 and num_steps > 0:
        base = seq_lens.reshape(-1, 1, 1).to(torch.int64)
        step = torch.arange(num_steps).view(1, 1, -1)
        branch = torch.arange(topk).view(1, -1, 1)
        src = torch.gather(rows, 1, (base + branch * num_steps + step).flatten(1))
        dst = (base + step).expand(-1, topk, -1).reshape(expanded.shape[0], num_steps)
        expanded.scatter_(1, dst, src.view(expanded.shape[0], num_steps))
    return expanded


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Copy KV rows `src_loc` onto rows `tgt_loc` in every layer buffer, in place.

    SGLang passes raw host addresses (`MHATokenToKVPool.data_ptrs`, one per K/V layer buffer)
    and row strides in bytes, so each buffer is viewed through its address. All source rows
    are read before any target row is written, like the Triton kernel, so overlapping
    `tgt_loc`/`src_loc` are safe.

    Args:
        data_ptrs: `[num_buffers]` uint64 addresses of contiguous CPU buffers.
        strides: `[num_buffers]` int64 bytes per KV row.
        tgt_loc: `[n]` int64 target rows.
        src_loc: `[n]` int64 source rows.

    Raises:
        ValueError: a row index is negative, a pointer is null, or lengths disagree.
    """
    if tgt_loc.numel() != src_loc.numel():
        raise ValueError("copy_all_layer_kv_cache_cpu: tgt_loc and src_loc differ in length")
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.reshape(-1).to(torch.int64)
    src = src_loc.reshape(-1).to(torch.int64)
    if int(torch.minimum(tgt.min(), src.min())) < 0:
        raise ValueError("copy_all_layer_kv_cache_cpu: negative KV row index")
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        buf = _host_bytes(int(ptr), rows * int(stride)).view(rows, int(stride))
        buf[tgt] = buf[src]


def _host_bytes(address: int, nbytes: int) -> torch.Tensor:
    """A writable uint8 view of `nbytes` of host memory at `address` (no copy)."""
    if address == 0:
        raise ValueError("copy_all_layer_kv_cache_cpu: null buffer pointer")
    raw = (ctypes.c_uint8 * nbytes).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8)


def _check_pool_len(req_to_token: torch.Tensor, pool_len: int, op: str) -> None:
    if req_to_token.dim() != 2 or req_to_token.shape[1] != pool_len:
        raise ValueError(
            f"{op}: pool_len={pool_len} but req_to_token has shape {tuple(req_to_token.shape)}"
        )

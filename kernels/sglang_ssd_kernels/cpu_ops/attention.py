"""Paged attention for SGLang's `intel_amx` backend: `decode_attention_cpu`, `extend_attention_cpu`.

KV lives in per-layer pool buffers `[pool_rows, kv_heads, head_dim]`; request `b`'s tokens are
the rows `req_to_token[req_pool_indices[b], :seq_len]`. Each request runs one
`scaled_dot_product_attention` over its gathered KV, laid out as SGLang's `torch_native`
backend lays it out (so plain decode matches it bit for bit); `logit_cap > 0` takes an explicit
float32 path, since SDPA has no soft cap.

Supported: causal self-attention, GQA/MQA, prefix + extend, a per-request tree mask in the
QLEN layout (`[ext_len x ext_len]` per request, the prefix always visible), non-causal
encoder-only extend, logit soft-capping, float8 KV caches with a dequantisation scale.
Unsupported arguments raise NotImplementedError: sliding windows, attention sinks, cross
attention.
"""

from __future__ import annotations

import itertools

import torch
from torch.nn.functional import scaled_dot_product_attention

_FP8_DTYPES = {torch.float8_e4m3fn, torch.float8_e5m2}


def decode_attention_cpu(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One query token per request against its paged KV; writes the new KV first.

    Args:
        query: `[bs, heads, head_dim]`.
        k_buffer: `[pool_rows, kv_heads, head_dim]` layer K pool; `key` is stored at `loc`.
        v_buffer: `[pool_rows, kv_heads, v_head_dim]` layer V pool; `value` stored at `loc`.
        k_scale: K dequantisation scale (float8 caches; must be 1.0 otherwise).
        v_scale: V dequantisation scale (same rule).
        output: `[bs, heads, v_head_dim]`, written.
        key: `[bs, kv_heads, head_dim]` new K, or None when the caller already stored it.
        value: `[bs, kv_heads, v_head_dim]` new V, or None.
        loc: `[bs]` int64 pool rows of the new token.
        attn_logits: scratch of the C++ kernel's split-KV reduction; unused here.
        req_to_token: `[max_num_reqs, pool_len]` int32.
        req_pool_indices: `[bs]` int.
        seq_lens: `[bs]` int64, KV length including the new token.
        sm_scale: softmax scale.
        logit_cap: soft cap `c * tanh(s / c)` when > 0.
        is_cross_attn: must be False.
        sliding_window_size: SGLang passes `layer.sliding_window_size + 1`; must be <= 0.
        encoder_lens: ignored for self-attention (SGLang passes the batch's field).
        sinks: must be None.

    Raises:
        NotImplementedError: an unsupported argument is set (see module docstring).
    """
    del attn_logits, encoder_lens
    _check_supported("decode_attention_cpu", is_cross_attn, sliding_window_size, sinks)
    _check_scales("decode_attention_cpu", k_buffer, k_scale, v_scale)
    if (key is None) != (value is None):
        raise ValueError("decode_attention_cpu: key and value must both be given or both None")
    if key is not None and value is not None:
        if k_buffer.dtype in _FP8_DTYPES:
            raise NotImplementedError(
                "decode_attention_cpu: storing new KV into a float8 cache is not implemented; "
                "write it with set_kv_buffer and pass key=value=None (as intel_amx does)"
            )
        rows = loc.reshape(-1).to(torch.int64)
        k_buffer[rows] = key.to(k_buffer.dtype)
        v_buffer[rows] = value.to(v_buffer.dtype)

    lens = seq_lens.reshape(-1).tolist()
    keys, values = _gather_kv(
        k_buffer, v_buffer, k_scale, v_scale, req_to_token, req_pool_indices, lens, query.dtype
    )
    start = 0
    for b, kv_len in enumerate(lens):
        k = keys[start : start + kv_len]
        v = values[start : start + kv_len]
        start += kv_len
        out = _attend(query[b : b + 1], k, v, None, sm_scale, logit_cap)
        output[b : b + 1] = out


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int | None,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Extend (prefill, chunked prefill, target verify) attention over prefix + new tokens.

    Request `b` has `ext = extend_seq_lens[b]` new tokens at rows
    `extend_start_loc[b] : + ext` of `q_extend`, and `prefix = seq_lens[b] - ext` cached ones
    (`req_to_token[req_pool_indices[b], :prefix]`). New tokens see the whole prefix and, among
    themselves, what `custom_mask` allows (QLEN layout, request blocks `ext x ext` back to back)
    or else a causal (`is_causal`) or full pattern.

    Args:
        q_extend: `[num_tokens, heads, head_dim]`.
        k_extend: `[num_tokens, kv_heads, head_dim]` new K, or None to read it from the pool
            (the caller stored it at `req_to_token[..., prefix:seq_len]`).
        v_extend: `[num_tokens, kv_heads, v_head_dim]` or None (same rule).
        o_extend: `[num_tokens, heads, v_head_dim]`, written.
        seq_lens: `[bs]` int, prefix + extend lengths.
        extend_seq_lens: `[bs]` int.
        extend_start_loc: `[bs]` int.
        max_len_extend: max of `extend_seq_lens` (a launch hint; unused).
        custom_mask: bool tree mask in the QLEN layout, or None.
        is_causal: causal pattern among new tokens when there is no `custom_mask`.
        k_buffer, v_buffer, k_scale, v_scale, req_to_token, req_pool_indices, sm_scale,
            logit_cap, is_cross_attn, sliding_window_size, encoder_lens, sinks: as for
            `decode_attention_cpu`.

    Raises:
        NotImplementedError: an unsupported argument is set.
        ValueError: only one of `k_extend`, `v_extend` is given, or `custom_mask` is shorter
            than the batch's blocks.
    """
    del max_len_extend, encoder_lens
    _check_supported("extend_attention_cpu", is_cross_attn, sliding_window_size, sinks)
    _check_scales("extend_attention_cpu", k_buffer, k_scale, v_scale)
    if (k_extend is None) != (v_extend is None):
        raise ValueError("extend_attention_cpu: k_extend and v_extend must both be given or None")
    total = seq_lens.reshape(-1).tolist()
    ext = extend_seq_lens.reshape(-1).tolist()
    starts = extend_start_loc.reshape(-1).tolist()
    # Without k_extend the new tokens' KV is already in the pool: gather it with the prefix.
    kv_lens = total if k_extend is None else [t - e for t, e in zip(total, ext, strict=True)]
    dtype = q_extend.dtype
    keys, values = _gather_kv(
        k_buffer, v_buffer, k_scale, v_scale, req_to_token, req_pool_indices, kv_lens, dtype
    )
    masks = [None] * len(ext) if custom_mask is None else _split_custom_mask(custom_mask, ext)
    kv_starts = [0, *itertools.accumulate(kv_lens)]
    for b, (seq_len, ext_len, q_start) in enumerate(zip(total, ext, starts, strict=True)):
        if ext_len == 0:
            continue
        rows = slice(q_start, q_start + ext_len)
        kv = slice(kv_starts[b], kv_starts[b + 1])
        k, v = keys[kv], values[kv]
        if k_extend is not None and v_extend is not None:
            k = torch.cat([k, k_extend[rows].to(k.dtype)])
            v = torch.cat([v, v_extend[rows].to(v.dtype)])
        mask, causal = _extend_mask(masks[b], ext_len, seq_len, is_causal)
        o_extend[rows] = _attend(q_extend[rows], k, v, mask, sm_scale, logit_cap, causal)


def _extend_mask(
    tree_block: torch.Tensor | None, ext_len: int, seq_len: int, is_causal: bool
) -> tuple[torch.Tensor | None, bool]:
    """One request's extend visibility: a bool `[ext_len, seq_len]` mask (or None) and `causal`.

    The prefix is always visible; among the new tokens, `tree_block` (`[ext_len, ext_len]`)
    when given, else causal when `is_causal`, else all. Without a prefix the causal case is
    SDPA's own `is_causal` (no mask). A one-token tree block that shows the token itself (a
    plain round's `[[True]]`: one position per request) is no mask at all, so that such a
    verify runs the very SDPA call `decode_attention_cpu` runs (bit for bit the decode step, and
    without building and applying a `[1, seq_len]` mask per request and layer). Larger blocks
    are not inspected: a speculative verify's tree never shows every token every other, and
    this runs per request and layer.
    """
    prefix = seq_len - ext_len
    if tree_block is not None and ext_len == 1 and bool(tree_block.all()):
        return None, False
    if tree_block is not None:
        mask = torch.ones(ext_len, seq_len, dtype=torch.bool)
        mask[:, prefix:] = tree_block
        return mask, False
    if is_causal and prefix > 0:
        return torch.ones(ext_len, seq_len, dtype=torch.bool).tril(prefix), False
    return None, is_causal


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
    causal: bool = False,
) -> torch.Tensor:
    """Token-major attention: q `[Lq, H, D]`, k `[Lk, Hkv, D]`, v `[Lk, Hkv, Dv]` -> `[Lq, H, Dv]`.

    `mask` is a bool `[Lq, Lk]` (True = visible); `causal` means top-left aligned causal with
    `Lq == Lk`.
    """
    qh, kh, vh = q.movedim(0, 1), k.movedim(0, 1), v.movedim(0, 1)
    if logit_cap > 0:
        return _attend_capped(qh, kh, vh, mask, sm_scale, logit_cap, causal).movedim(1, 0)
    out = scaled_dot_product_attention(
        qh.unsqueeze(0),
        kh.unsqueeze(0),
        vh.unsqueeze(0),
        attn_mask=mask,
        is_causal=causal,
        scale=sm_scale,
        enable_gqa=qh.shape[0] != kh.shape[0],
    )
    return out.squeeze(0).movedim(1, 0)


def _attend_capped(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
    causal: bool,
) -> torch.Tensor:
    """Head-major float32 attention with `logit_cap * tanh(s / logit_cap)` on the scores."""
    group = q.shape[0] // k.shape[0]
    kf = k.float().repeat_interleave(group, 0)
    vf = v.float().repeat_interleave(group, 0)
    scores = torch.matmul(q.float(), kf.transpose(1, 2)) * sm_scale
    scores = logit_cap * torch.tanh(scores / logit_cap)
    if causal:
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), vf).to(q.dtype)


def _gather_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: list[int],
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V rows of the first `lens[b]` tokens of every request, concatenated, as `dtype`."""
    lens_t = torch.tensor(lens, dtype=torch.int64)
    seg = torch.repeat_interleave(torch.arange(len(lens)), lens_t)
    col = torch.arange(seg.numel()) - (torch.cumsum(lens_t, 0) - lens_t)[seg]
    rows = req_to_token[req_pool_indices.reshape(-1).to(torch.int64)[seg], col].to(torch.int64)
    return _dequant(k_buffer[rows], k_scale, dtype), _dequant(v_buffer[rows], v_scale, dtype)


def _dequant(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    if x.dtype in _FP8_DTYPES:
        x = x.to(torch.float32)
        if scale != 1.0:
            x = x * scale
    return x.to(dtype)


def _split_custom_mask(custom_mask: torch.Tensor, ext: list[int]) -> list[torch.Tensor]:
    """Per-request `[ext_len, ext_len]` blocks of a QLEN-layout tree mask."""
    needed = sum(e * e for e in ext)
    flat = custom_mask.reshape(-1)
    if flat.numel() < needed:
        raise ValueError(
            f"extend_attention_cpu: custom_mask has {flat.numel()} entries, the QLEN layout of "
            f"this batch needs {needed}"
        )
    blocks, start = [], 0
    for e in ext:
        blocks.append(flat[start : start + e * e].view(e, e).to(torch.bool))
        start += e * e
    return blocks


def _check_supported(
    op: str, is_cross_attn: bool, sliding_window_size: int, sinks: torch.Tensor | None
) -> None:
    if is_cross_attn:
        raise NotImplementedError(f"{op}: cross attention is not implemented")
    if sliding_window_size > 0:
        raise NotImplementedError(
            f"{op}: sliding-window attention (sliding_window_size={sliding_window_size}) "
            "is not implemented"
        )
    if sinks is not None:
        raise NotImplementedError(f"{op}: attention sinks are not implemented")


def _check_scales(op: str, k_buffer: torch.Tensor, k_scale: float, v_scale: float) -> None:
    if k_buffer.dtype not in _FP8_DTYPES and (k_scale != 1.0 or v_scale != 1.0):
        raise NotImplementedError(
            f"{op}: KV scales k_scale={k_scale}, v_scale={v_scale} on a {k_buffer.dtype} cache "
            "are not implemented (scales apply to float8 caches only)"
        )

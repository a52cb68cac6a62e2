"""Paged decode/extend attention against a dense float64 reference.

Each request's KV sits at random rows of a shared pool (random `req_to_token` permutations);
the ops are called through `torch.ops.sgl_kernel.*` with the positional argument order of
SGLang's intel_amx backend (layers/attention/intel_amx_backend.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import pytest
import sgl_kernel  # noqa: F401  registers torch.ops.sgl_kernel.*
import torch
from sglang_source import load_function
from sglang_ssd_kernels.cpu_ops.attention import _extend_mask
from torch.nn.functional import scaled_dot_product_attention

POOL_ROWS = 1024
POOL_LEN = 128


@dataclass
class Paged:
    """A batch laid out in a KV pool: dense per-request K/V plus where each token lives."""

    k_buffer: torch.Tensor  # [POOL_ROWS, kv_heads, head_dim]
    v_buffer: torch.Tensor  # [POOL_ROWS, kv_heads, v_head_dim]
    req_to_token: torch.Tensor  # [reqs, POOL_LEN] int32
    req_pool_indices: torch.Tensor  # [bs]
    keys: list[torch.Tensor]  # per request [seq_len, kv_heads, head_dim]
    values: list[torch.Tensor]


def make_paged(gen, seq_lens, kv_heads, head_dim, v_head_dim, dtype, store_upto=None) -> Paged:
    """Random KV for each request; tokens `[:store_upto[b]]` are written into the pool."""
    bs = len(seq_lens)
    store_upto = seq_lens if store_upto is None else store_upto
    k_buffer = torch.randn(POOL_ROWS, kv_heads, head_dim, generator=gen).to(dtype)
    v_buffer = torch.randn(POOL_ROWS, kv_heads, v_head_dim, generator=gen).to(dtype)
    req_pool_indices = torch.randperm(bs + 2, generator=gen)[:bs]
    rows = torch.randperm(POOL_ROWS, generator=gen)[: (bs + 2) * POOL_LEN]
    req_to_token = rows.view(bs + 2, POOL_LEN).to(torch.int32)
    keys, values = [], []
    for b, seq_len in enumerate(seq_lens):
        k = torch.randn(seq_len, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(seq_len, kv_heads, v_head_dim, generator=gen).to(dtype)
        where = req_to_token[req_pool_indices[b], : store_upto[b]].long()
        k_buffer[where], v_buffer[where] = k[: store_upto[b]], v[: store_upto[b]]
        keys.append(k)
        values.append(v)
    return Paged(k_buffer, v_buffer, req_to_token, req_pool_indices, keys, values)


def reference(q, k, v, visible, scale, logit_cap=0.0) -> torch.Tensor:
    """float64 attention: q `[Lq, H, D]`, k/v `[Lk, Hkv, *]`, visible bool `[Lq, Lk]`."""
    group = q.shape[1] // k.shape[1]
    kh = k.double().repeat_interleave(group, 1)
    vh = v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kh) * scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vh)


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}


def random_tree_block(gen: torch.Generator, n: int) -> torch.Tensor:
    block = torch.zeros(n, n, dtype=torch.bool)
    block[0, 0] = True
    for i in range(1, n):
        block[i] = block[int(torch.randint(i, (1,), generator=gen))]
        block[i, i] = True
    return block


def switched_off(overrides: dict) -> tuple:
    """The ops' trailing is_cross_attn, sliding_window_size, encoder_lens, sinks: off, unless
    `overrides` switches one on (these are the arguments the CPU ops reject)."""
    args = dict(is_cross_attn=False, sliding_window_size=0, encoder_lens=None, sinks=None)
    args.update(overrides)
    return args["is_cross_attn"], args["sliding_window_size"], args["encoder_lens"], args["sinks"]


def decode(
    q, paged, key, value, loc, seq_lens, scale, logit_cap=0.0, k_scale=1.0, v_scale=1.0, **overrides
):
    out = torch.empty(q.shape[0], q.shape[1], paged.v_buffer.shape[-1], dtype=q.dtype)
    attn_logits = torch.zeros(q.shape[0], q.shape[1], 8, paged.v_buffer.shape[-1] + 1)
    torch.ops.sgl_kernel.decode_attention_cpu(
        q,
        paged.k_buffer,
        paged.v_buffer,
        k_scale,
        v_scale,
        out,
        key,
        value,
        loc,
        attn_logits,
        paged.req_to_token,
        paged.req_pool_indices,
        seq_lens,
        scale,
        logit_cap,
        *switched_off(overrides),
    )
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "v_head_dim"), [(4, 2, 16), (4, 1, 16), (2, 2, 8)])
@pytest.mark.parametrize("logit_cap", [0.0, 5.0])
def test_decode_matches_dense_reference(dtype, heads, kv_heads, v_head_dim, logit_cap) -> None:
    gen = torch.Generator().manual_seed(heads * 7 + kv_heads + v_head_dim)
    head_dim, seq_lens = 16, [1, 9, 70]
    # the last token's KV is not in the pool yet: the op stores it at `loc`
    paged = make_paged(
        gen, seq_lens, kv_heads, head_dim, v_head_dim, dtype, store_upto=[s - 1 for s in seq_lens]
    )
    q = torch.randn(len(seq_lens), heads, head_dim, generator=gen).to(dtype)
    key = torch.stack([k[-1] for k in paged.keys])
    value = torch.stack([v[-1] for v in paged.values])
    loc = torch.stack(
        [
            paged.req_to_token[r, s - 1]
            for r, s in zip(paged.req_pool_indices, seq_lens, strict=True)
        ]
    ).long()
    scale = 1 / math.sqrt(head_dim)

    out = decode(q, paged, key, value, loc, torch.tensor(seq_lens), scale, logit_cap)

    assert torch.equal(paged.k_buffer[loc], key) and torch.equal(paged.v_buffer[loc], value)
    for b, seq_len in enumerate(seq_lens):
        visible = torch.ones(1, seq_len, dtype=torch.bool)
        expected = reference(
            q[b : b + 1], paged.keys[b], paged.values[b], visible, scale, logit_cap
        )
        torch.testing.assert_close(out[b : b + 1].double(), expected, **tolerance(dtype))


def test_decode_is_bitwise_torch_native() -> None:
    """Plain bf16 GQA decode equals SGLang's torch_native backend exactly (same SDPA calls)."""
    torch_native_decode = load_function(
        "srt/layers/attention/torch_native_backend.py",
        "_run_sdpa_forward_decode",
        {
            "torch": torch,
            "Optional": Optional,
            "scaled_dot_product_attention": scaled_dot_product_attention,
        },
    )
    gen = torch.Generator().manual_seed(3)
    seq_lens = [5, 40, 17]
    paged = make_paged(gen, seq_lens, 2, 32, 32, torch.bfloat16)
    q = torch.randn(3, 8, 32, generator=gen).to(torch.bfloat16)
    lens = torch.tensor(seq_lens)
    loc = torch.zeros(3, dtype=torch.int64)
    out = decode(q, paged, None, None, loc, lens, 0.125)
    expected = torch.empty_like(out)
    torch_native_decode(
        None,
        q,
        expected,
        paged.k_buffer,
        paged.v_buffer,
        paged.req_to_token,
        paged.req_pool_indices,
        lens,
        scaling=0.125,
        enable_gqa=True,
    )
    assert torch.equal(out, expected)


def test_decode_float8_cache_dequantises_with_scale() -> None:
    gen = torch.Generator().manual_seed(5)
    seq_lens = [6, 11]
    paged = make_paged(gen, seq_lens, 2, 16, 16, torch.float32)
    k_scale, v_scale = 0.5, 2.0
    fp8 = Paged(
        (paged.k_buffer / k_scale).to(torch.float8_e4m3fn),
        (paged.v_buffer / v_scale).to(torch.float8_e4m3fn),
        paged.req_to_token,
        paged.req_pool_indices,
        paged.keys,
        paged.values,
    )
    q = torch.randn(2, 4, 16, generator=gen)
    loc = torch.zeros(2, dtype=torch.int64)
    out = decode(
        q, fp8, None, None, loc, torch.tensor(seq_lens), 0.25, k_scale=k_scale, v_scale=v_scale
    )
    for b, seq_len in enumerate(seq_lens):
        rows = paged.req_to_token[paged.req_pool_indices[b], :seq_len].long()
        k = fp8.k_buffer[rows].float() * k_scale
        v = fp8.v_buffer[rows].float() * v_scale
        expected = reference(q[b : b + 1], k, v, torch.ones(1, seq_len, dtype=torch.bool), 0.25)
        torch.testing.assert_close(out[b : b + 1].double(), expected, atol=1e-5, rtol=1e-5)


def extend(
    q,
    k_ext,
    v_ext,
    paged,
    seq_lens,
    ext_lens,
    scale,
    logit_cap=0.0,
    custom_mask=None,
    is_causal=True,
    **overrides,
):
    out = torch.empty(q.shape[0], q.shape[1], paged.v_buffer.shape[-1], dtype=q.dtype)
    starts = (torch.cumsum(ext_lens, 0) - ext_lens).int()
    torch.ops.sgl_kernel.extend_attention_cpu(
        q,
        k_ext,
        v_ext,
        out,
        paged.k_buffer,
        paged.v_buffer,
        1.0,
        1.0,
        paged.req_to_token,
        paged.req_pool_indices,
        seq_lens,
        ext_lens.int(),
        starts,
        int(ext_lens.max()),
        scale,
        logit_cap,
        *switched_off(overrides),
        custom_mask,
        is_causal,
    )
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_source", ["k_extend", "pool"])
@pytest.mark.parametrize("pattern", ["causal", "tree", "full"])
@pytest.mark.parametrize("logit_cap", [0.0, 3.0])
def test_extend_matches_dense_reference(dtype, kv_source, pattern, logit_cap) -> None:
    gen = torch.Generator().manual_seed(len(pattern) * 13 + len(kv_source))
    heads, kv_heads, head_dim = 6, 2, 16
    prefix_lens, ext_lens = [0, 5, 37, 2], [4, 1, 6, 5]
    seq_lens = [p + e for p, e in zip(prefix_lens, ext_lens, strict=True)]
    store = seq_lens if kv_source == "pool" else prefix_lens
    paged = make_paged(gen, seq_lens, kv_heads, head_dim, head_dim, dtype, store_upto=store)
    q = torch.randn(sum(ext_lens), heads, head_dim, generator=gen).to(dtype)
    k_ext = torch.cat([k[p:] for k, p in zip(paged.keys, prefix_lens, strict=True)])
    v_ext = torch.cat([v[p:] for v, p in zip(paged.values, prefix_lens, strict=True)])
    blocks = [random_tree_block(gen, e) for e in ext_lens]
    custom_mask = torch.cat([b.reshape(-1) for b in blocks]) if pattern == "tree" else None
    scale = 0.3

    out = extend(
        q,
        k_ext if kv_source == "k_extend" else None,
        v_ext if kv_source == "k_extend" else None,
        paged,
        torch.tensor(seq_lens),
        torch.tensor(ext_lens),
        scale,
        logit_cap,
        custom_mask,
        is_causal=pattern != "full",
    )

    start = 0
    for b, (prefix, ext) in enumerate(zip(prefix_lens, ext_lens, strict=True)):
        visible = torch.ones(ext, prefix + ext, dtype=torch.bool)
        if pattern == "causal":
            visible[:, prefix:] = torch.ones(ext, ext, dtype=torch.bool).tril()
        elif pattern == "tree":
            visible[:, prefix:] = blocks[b]
        expected = reference(
            q[start : start + ext], paged.keys[b], paged.values[b], visible, scale, logit_cap
        )
        torch.testing.assert_close(out[start : start + ext].double(), expected, **tolerance(dtype))
        start += ext


@pytest.mark.parametrize("kv_source", ["k_extend", "pool"])
def test_one_position_verify_is_bitwise_decode(kv_source) -> None:
    """A plain round verifies one position per request with the tree mask `[[True]]`: it must
    run exactly the decode step's attention (the same SDPA call, no mask), so that its greedy
    token is plain decoding's."""
    gen = torch.Generator().manual_seed(11)
    seq_lens = [9, 33, 2]
    paged = make_paged(gen, seq_lens, 2, 32, 32, torch.bfloat16)
    q = torch.randn(3, 8, 32, generator=gen).to(torch.bfloat16)
    lens = torch.tensor(seq_lens)
    expected = decode(q, paged, None, None, torch.zeros(3, dtype=torch.int64), lens, 0.125)
    k_ext = torch.stack([k[-1] for k in paged.keys])
    v_ext = torch.stack([v[-1] for v in paged.values])
    if kv_source == "k_extend":  # the new token's KV comes with the call, the prefix from the pool
        paged = make_paged(torch.Generator().manual_seed(11), seq_lens, 2, 32, 32,
                           torch.bfloat16, store_upto=[n - 1 for n in seq_lens])  # fmt: skip
    out = extend(
        q,
        k_ext if kv_source == "k_extend" else None,
        v_ext if kv_source == "k_extend" else None,
        paged,
        lens,
        torch.ones(3, dtype=torch.int64),
        0.125,
        custom_mask=torch.ones(3, dtype=torch.bool),
    )
    assert torch.equal(out, expected)
    # ... without building a mask: `[[True]]` (or any all-visible block) is no mask at all.
    assert _extend_mask(torch.ones(1, 1, dtype=torch.bool), 1, 40, True) == (None, False)
    chain, causal = _extend_mask(torch.ones(2, 2, dtype=torch.bool).tril(), 2, 40, True)
    assert chain is not None and not chain[0, -1] and not causal


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"sliding_window_size": 4}, "sliding-window"),
        ({"sinks": torch.zeros(4)}, "sinks"),
        ({"is_cross_attn": True}, "cross attention"),
    ],
)
def test_unsupported_arguments_raise(override, message) -> None:
    gen = torch.Generator().manual_seed(0)
    paged = make_paged(gen, [3], 2, 8, 8, torch.float32)
    q = torch.randn(1, 4, 8)
    with pytest.raises(NotImplementedError, match=message):
        decode_stored(q, paged, **override)
    q3 = torch.randn(3, 4, 8)
    with pytest.raises(NotImplementedError, match=message):
        extend(q3, None, None, paged, torch.tensor([3]), torch.tensor([3]), 0.3, **override)


def test_scales_on_unquantised_cache_raise() -> None:
    gen = torch.Generator().manual_seed(0)
    paged = make_paged(gen, [3], 2, 8, 8, torch.float32)
    with pytest.raises(NotImplementedError, match="scales"):
        decode_stored(torch.randn(1, 4, 8), paged, k_scale=0.5)


def decode_stored(q, paged, **overrides):
    """`decode` of one query over a 3-token request whose KV is already in the pool."""
    loc = torch.zeros(1, dtype=torch.int64)
    return decode(q, paged, None, None, loc, torch.tensor([3]), 0.3, **overrides)

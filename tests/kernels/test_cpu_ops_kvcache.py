"""KV bookkeeping ops against SGLang's own Triton kernels, run by Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch
from sglang_source import triton_reference
from sglang_ssd_kernels.cpu_ops import kvcache

CACHE_LOCS = "kernels/ops/speculative/cache_locs.py"
POOL_LEN = 96
MAX_REQS = 8
POOL_ROWS = 1024


def random_table(gen: torch.Generator) -> torch.Tensor:
    return (
        torch.randperm(POOL_ROWS, generator=gen)[: MAX_REQS * POOL_LEN]
        .view(MAX_REQS, POOL_LEN)
        .to(torch.int32)
    )


def random_ranges(gen: torch.Generator, bs: int, dtype: torch.dtype):
    start = torch.randint(0, POOL_LEN // 2, (bs,), generator=gen)
    end = start + torch.randint(0, POOL_LEN // 2, (bs,), generator=gen)
    req = torch.randperm(MAX_REQS, generator=gen)[:bs]
    return req, start.to(dtype), end.to(dtype)


@pytest.mark.parametrize("offset_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("seed", range(3))
def test_assign_req_to_token_pool_matches_triton(seed: int, offset_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(seed)
    bs = 1 + seed * 2
    req, start, end = random_ranges(gen, bs, offset_dtype)
    locs = torch.randperm(POOL_ROWS, generator=gen)[: int((end - start).sum())]
    table = random_table(gen)
    expected = table.clone()
    kernel = triton_reference("srt/mem_cache/allocation.py", "assign_req_to_token_pool")
    kernel[(bs,)](req, expected, start, end, locs, POOL_LEN, 8)

    kvcache.assign_req_to_token_pool_cpu(req, table, start, end, locs, POOL_LEN)
    assert torch.equal(table, expected)


@pytest.mark.parametrize("seed", range(3))
def test_assign_extend_cache_locs_matches_triton(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    bs = 2 + seed
    req, start, end = random_ranges(gen, bs, torch.int64)
    table = random_table(gen)
    total = int((end - start).sum())
    expected = torch.full((total + 3,), -7, dtype=torch.int64)
    got = expected.clone()
    kernel = triton_reference(CACHE_LOCS, "assign_extend_cache_locs")
    kernel[(bs,)](req, table, start, end, expected, POOL_LEN, 8)

    kvcache.assign_extend_cache_locs_cpu(req, table, start, end, got, POOL_LEN)
    assert torch.equal(got, expected)  # the tail past `total` is left alone


@pytest.mark.parametrize(("topk", "steps"), [(1, 4), (3, 2)])
def test_assign_draft_cache_locs_contiguous_matches_triton(topk: int, steps: int) -> None:
    gen = torch.Generator().manual_seed(topk)
    bs = 3
    req = torch.randperm(MAX_REQS, generator=gen)[:bs]
    seq_lens = torch.randint(1, POOL_LEN - topk * steps, (bs,), generator=gen)
    table = random_table(gen)
    expected = torch.empty(bs * topk * steps, dtype=torch.int64)
    kernel = triton_reference(CACHE_LOCS, "assign_draft_cache_locs_contiguous")
    kernel[(bs,)](req, table, seq_lens, expected, POOL_LEN, topk, steps, BS=bs)

    got = torch.empty_like(expected)
    kvcache.assign_draft_cache_locs_contiguous_cpu(
        req, table, seq_lens.to(torch.int32), got, POOL_LEN, topk, steps
    )
    assert torch.equal(got, expected)


@pytest.mark.parametrize(("topk", "steps"), [(1, 4), (2, 3), (4, 1)])
def test_build_draft_decode_metadata_contract(topk: int, steps: int) -> None:
    """Row b*topk+k: request b's prefix, then branch k's slots from seq_len + k*steps."""
    gen = torch.Generator().manual_seed(steps)
    req = torch.tensor([5, 0, 3])
    seq_lens = torch.tensor([7, 1, 40])
    table = random_table(gen)

    got = kvcache.build_draft_decode_metadata_cpu(table, req, seq_lens, topk, steps, POOL_LEN)

    assert got.shape == (3 * topk, POOL_LEN) and got.dtype == torch.int32
    for b in range(3):
        sl = int(seq_lens[b])
        row = table[req[b]]
        for k in range(topk):
            out = got[b * topk + k]
            assert torch.equal(out[:sl], row[:sl])
            assert torch.equal(out[sl : sl + steps], row[sl + k * steps : sl + (k + 1) * steps])


def test_copy_all_layer_kv_cache_matches_triton() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, row_elems = 64, 24
    layers = [
        torch.randn(rows, 2, row_elems // 2, generator=gen).to(torch.bfloat16) for _ in range(3)
    ]
    layers.append(torch.randn(rows, row_elems, generator=gen))  # a float32 buffer: other stride
    reference = [t.clone() for t in layers]
    tgt = torch.tensor([3, 9, 10, 40])
    src = torch.tensor([9, 3, 63, 0])  # 3 <-> 9 overlap: every read happens before a write

    def pointers(buffers: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        ptrs = torch.tensor([t.data_ptr() for t in buffers], dtype=torch.uint64)
        strides = torch.tensor([t.stride(0) * t.element_size() for t in buffers])
        return ptrs, strides

    kvcache.copy_all_layer_kv_cache_cpu(*pointers(layers), tgt, src)

    for got, before in zip(layers, reference, strict=True):
        expected = before.clone()
        expected[tgt] = before[src]
        assert torch.equal(got, expected)
    kernel = triton_reference("kernels/ops/kvcache/cache_move.py", "copy_all_layer_kv_cache_tiled")
    kernel[(len(reference), 8)](*pointers(reference), tgt, src, 4, 4, BYTES_PER_TILE=16)
    for got, expected in zip(layers, reference, strict=True):
        assert torch.equal(got, expected)


def test_copy_all_layer_kv_cache_rejects_negative_rows() -> None:
    buf = torch.zeros(4, 8)
    ptrs = torch.tensor([buf.data_ptr()], dtype=torch.uint64)
    with pytest.raises(ValueError, match="negative"):
        kvcache.copy_all_layer_kv_cache_cpu(
            ptrs, torch.tensor([32]), torch.tensor([-1]), torch.tensor([0])
        )


def test_pool_len_mismatch_raises() -> None:
    table = torch.zeros(2, 10, dtype=torch.int32)
    one = torch.tensor([0])
    with pytest.raises(ValueError, match="pool_len"):
        kvcache.assign_req_to_token_pool_cpu(one, table, one, one + 1, one, 11)

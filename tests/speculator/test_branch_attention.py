"""branch_attention (paged, custom-mask, GQA) against the dense float64 reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_ssd_kernels.branch_attention import (
    branch_attention,
    causal_custom_mask,
    dense_mask_from_layout,
    dense_reference,
    plan_branch_attention,
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small tensors gain nothing from threads; OpenMP threads on a busy machine spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


HEADS = [(1, 1), (2, 1), (4, 2), (6, 3), (8, 2), (14, 2)]  # (H, Hkv) incl. the 0.5B draft's


def _random_case(
    seed: int,
    qo_lens: list[int],
    kv_lens: list[int],
    heads: tuple[int, int],
    head_dim: int,
    dv: int,
    density: float,
    row_kind: str,
    dtype: torch.dtype = torch.float32,
):
    gen = torch.Generator().manual_seed(seed)
    num_heads, kv_heads = heads
    num_slots = max(kv_lens, default=0) + 8
    n = sum(qo_lens)
    q = torch.randn(n, num_heads, head_dim, generator=gen).to(dtype)
    k_cache = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_slots, kv_heads, dv, generator=gen).to(dtype)
    # Distinct slots within a segment; segments may share slots (a shared prefix).
    slots = [torch.randperm(num_slots, generator=gen)[:kv] for kv in kv_lens]
    blocks = []
    for qo, kv in zip(qo_lens, kv_lens, strict=True):
        block = torch.rand(qo, kv, generator=gen) < density
        if row_kind == "single" and kv > 0:
            # Every other row sees exactly one slot ("fully masked except self").
            one = torch.zeros(qo, kv, dtype=torch.bool)
            one[torch.arange(qo), torch.randint(0, kv, (qo,), generator=gen)] = True
            block = torch.where(torch.arange(qo).unsqueeze(1) % 2 == 0, one, block)
        elif row_kind == "empty" and qo > 0:
            block[0] = False
        blocks.append(block.reshape(-1))
    mask = torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.bool)
    qo_indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv_indices = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)
    return q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices.to(torch.int32), mask, num_slots


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    segments=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 12)), min_size=1, max_size=5),
    heads=st.sampled_from(HEADS),
    head_dim=st.sampled_from([4, 8, 16]),
    dv_differs=st.booleans(),
    density=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
    row_kind=st.sampled_from(["random", "single", "empty"]),
    strategy=st.sampled_from(["auto", "padded", "segments"]),
    use_mask=st.booleans(),
)
def test_matches_dense_reference(
    seed, segments, heads, head_dim, dv_differs, density, row_kind, strategy, use_mask
):
    qo_lens = [qo for qo, _ in segments]
    kv_lens = [kv for _, kv in segments]
    dv = head_dim * 2 if dv_differs else head_dim
    q, k, v, qo_ptr, kv_ptr, idx, mask, slots = _random_case(
        seed, qo_lens, kv_lens, heads, head_dim, dv, density, row_kind
    )
    mask = mask if use_mask else None
    scale = head_dim**-0.5
    out = branch_attention(q, k, v, qo_ptr, kv_ptr, idx, mask, scale, strategy=strategy)
    ref = dense_reference(q, k, v, dense_mask_from_layout(qo_ptr, kv_ptr, idx, mask, slots), scale)
    assert out.shape == (sum(qo_lens), heads[0], dv)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_bfloat16_close_to_reference():
    q, k, v, qo_ptr, kv_ptr, idx, mask, slots = _random_case(
        3, [5, 1, 7], [40, 33, 60], (14, 2), 64, 64, 0.6, "single", dtype=torch.bfloat16
    )
    out = branch_attention(q, k, v, qo_ptr, kv_ptr, idx, mask, 0.125)
    ref = dense_reference(
        q.float(),
        k.float(),
        v.float(),
        dense_mask_from_layout(qo_ptr, kv_ptr, idx, mask, slots),
        0.125,
    )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_fully_masked_rows_are_zero_and_self_only_rows_copy_value():
    num_slots, heads, d = 6, 2, 4
    q = torch.randn(3, heads, d)
    k = torch.randn(num_slots, 1, d)
    v = torch.randn(num_slots, 1, d)
    mask = torch.tensor([[True, False, False], [False, False, False], [False, True, True]])
    idx = torch.tensor([4, 1, 2])
    out = branch_attention(
        q, k, v, torch.tensor([0, 3]), torch.tensor([0, 3]), idx, mask.reshape(-1), 0.5
    )
    torch.testing.assert_close(out[0], v[4].expand(heads, d))  # sees only slot 4
    assert (out[1] == 0).all()


def test_causal_mask_equals_causal_sdpa():
    torch.manual_seed(0)
    n, heads, d = 9, 4, 8
    q, k, v = torch.randn(n, heads, d), torch.randn(n, heads, d), torch.randn(n, heads, d)
    mask = causal_custom_mask([n], [n])
    out = branch_attention(
        q, k, v, torch.tensor([0, n]), torch.tensor([0, n]), torch.arange(n), mask, d**-0.5
    )
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    ).transpose(0, 1)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    # Append: 3 new queries after 5 cached slots see 6, 7, 8 slots.
    appended = causal_custom_mask([3], [8]).view(3, 8)
    assert appended.sum(1).tolist() == [6, 7, 8]


def test_plan_is_reusable_across_layers():
    q, k, v, qo_ptr, kv_ptr, idx, mask, _ = _random_case(1, [3, 2], [7, 9], (4, 2), 8, 8, 0.5, "")
    plan = plan_branch_attention(qo_ptr, kv_ptr, idx, mask)
    first = plan.run(q, k, v, 0.3)
    second = plan.run(q, k * 2, v, 0.3)
    expected = branch_attention(q, k * 2, v, qo_ptr, kv_ptr, idx, mask, 0.3)
    torch.testing.assert_close(plan.run(q, k, v, 0.3), first)
    torch.testing.assert_close(second, expected)


@pytest.mark.parametrize(
    ("qo_indptr", "kv_indptr", "indices", "mask_len", "match"),
    [
        ([0, 2], [0, 3, 4], [0, 1, 2, 3], 6, "entries"),
        ([1, 2], [0, 3], [0, 1, 2], 3, "start at 0"),
        ([0, 2], [0, 3], [0, 1], 6, "kv_indices has"),
        ([0, 2], [0, 3], [0, 1, -2], 6, ">= 0"),
        ([0, 2], [0, 3], [0, 1, 2], 5, "custom_mask has 5"),
    ],
)
def test_malformed_layouts_raise(qo_indptr, kv_indptr, indices, mask_len, match):
    with pytest.raises(ValueError, match=match):
        plan_branch_attention(
            torch.tensor(qo_indptr),
            torch.tensor(kv_indptr),
            torch.tensor(indices),
            torch.ones(mask_len, dtype=torch.bool),
        )


def test_run_checks_shapes_and_slot_range():
    plan = plan_branch_attention(
        torch.tensor([0, 2]), torch.tensor([0, 2]), torch.tensor([0, 9]), None
    )
    q = torch.randn(2, 2, 4)
    with pytest.raises(ValueError, match="out of range"):
        plan.run(q, torch.randn(5, 1, 4), torch.randn(5, 1, 4), 1.0)
    with pytest.raises(ValueError, match="rows"):
        plan.run(torch.randn(3, 2, 4), torch.randn(10, 1, 4), torch.randn(10, 1, 4), 1.0)
    with pytest.raises(ValueError, match="dtype"):
        plan.run(q.double(), torch.randn(10, 1, 4), torch.randn(10, 1, 4), 1.0)

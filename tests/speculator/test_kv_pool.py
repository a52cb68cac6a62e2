"""KVPool: slot allocation, exhaustion, double-free detection."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ssd.speculator.kv_pool import (
    KVPool,
    KVPoolExhausted,
    affordable_slots,
    available_memory,
)


def _pool(num_slots: int = 16) -> KVPool:
    return KVPool(
        num_layers=2, num_slots=num_slots, num_kv_heads=2, head_dim=4, dtype=torch.float32
    )


def test_shapes_and_counts():
    pool = _pool()
    assert len(pool.k) == len(pool.v) == 2
    assert pool.k[0].shape == (16, 2, 4) and pool.v[1].dtype == torch.float32
    assert pool.bytes_per_slot == 2 * 2 * 2 * 4 * 4
    slots = pool.alloc(5)
    assert slots.dtype == torch.int64 and slots.tolist() == [0, 1, 2, 3, 4]
    assert (pool.num_used, pool.num_free) == (5, 11)
    pool.free(slots[1:3])
    assert (pool.num_used, pool.num_free) == (3, 13)
    assert pool.is_allocated(torch.arange(5)).tolist() == [True, False, False, True, True]


def test_exhaustion_raises_and_allocates_nothing():
    pool = _pool(8)
    pool.alloc(6)
    with pytest.raises(KVPoolExhausted, match="3 slots requested, 2 of 8 free"):
        pool.alloc(3)
    assert pool.num_free == 2
    assert pool.alloc(2).numel() == 2
    assert pool.alloc(0).numel() == 0


@pytest.mark.parametrize(
    ("to_free", "match"),
    [([3], "not allocated"), ([0, 0], "repeated"), ([99], "out of range"), ([-1], "out of range")],
)
def test_bad_frees_raise(to_free, match):
    pool = _pool()
    pool.alloc(2)
    with pytest.raises(ValueError, match=match):
        pool.free(torch.tensor(to_free))
    assert pool.num_used == 2


def test_double_free_raises():
    pool = _pool()
    slots = pool.alloc(3)
    pool.free(slots)
    with pytest.raises(ValueError):
        pool.free(slots)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=40))
def test_random_alloc_free_keeps_slots_distinct(ops):
    pool = _pool(24)
    held: list[int] = []
    for is_alloc, n in ops:
        if is_alloc:
            if n > pool.num_free:
                with pytest.raises(KVPoolExhausted):
                    pool.alloc(n)
                continue
            got = pool.alloc(n).tolist()
            assert not set(got) & set(held)
            held += got
        else:
            give, held = held[:n], held[n:]
            pool.free(torch.tensor(give, dtype=torch.int64))
        assert pool.num_used == len(held) == len(set(held))
    assert set(pool.is_allocated(torch.arange(24)).nonzero().squeeze(1).tolist()) == set(held)


def test_a_pool_takes_at_most_its_share_of_the_memory_left():
    assert affordable_slots(1000, bytes_per_slot=100, available_bytes=10**6) == 1000
    assert affordable_slots(10**6, bytes_per_slot=100, available_bytes=10**6) == 5000
    assert affordable_slots(10**6, 100, 10**6, share=0.1) == 1000
    assert affordable_slots(10, 100, 0) == 1
    assert available_memory("cpu") > 0


def test_draft_model_cuts_a_pool_the_device_cannot_hold(tiny_draft, monkeypatch):
    import sglang_ssd.speculator.draft_model as draft_model

    monkeypatch.setattr(draft_model, "available_memory", lambda device: 2 * 1000 * 256)
    model = draft_model.DraftModel.load(
        tiny_draft, dtype=torch.float32, num_slots=10**6, memory_share=0.5
    )
    assert model.kv_pool.bytes_per_slot == 256  # 1 layer, 2 KV heads of 16, K and V, fp32
    assert model.kv_pool.num_slots == 1000

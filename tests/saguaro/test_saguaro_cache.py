"""SpeculationCache: hits, misses, replacement, bounds, sparse q
(docs/design.md#the-speculation-cache)."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.saguaro import SamplingBatch, SparseProbs, SpeculationCache, verify

V, D = 50, 3


def _round(n: int, seed: int = 0, sparse_k: int | None = None):
    """n branches: keys (k, bonus), tokens [n, D], q [n, D, V] dense or SparseProbs."""
    gen = torch.Generator().manual_seed(seed)
    ks = torch.arange(n) % (D + 1)
    bonus = torch.arange(n) + 10
    tokens = torch.randint(V, (n, D), generator=gen)
    if sparse_k is None:
        return ks, bonus, tokens, torch.softmax(torch.randn(n, D, V, generator=gen), dim=-1)
    values, indices = torch.softmax(torch.randn(n, D, V, generator=gen), -1).topk(sparse_k, -1)
    return ks, bonus, tokens, SparseProbs(indices, values / values.sum(-1, keepdim=True))


def test_hits_and_misses_gather_the_stored_branch() -> None:
    cache = SpeculationCache(V)
    ks, bonus, tokens, q = _round(8)
    cache.populate("a", ks, bonus, tokens, q)
    found = cache.lookup(["a", "a", "b", "a"], [int(ks[2]), 0, 0, int(ks[5])], [12, 99, 10, 15])
    assert found.hit.tolist() == [True, False, False, True]
    assert torch.equal(found.draft_tokens[0], tokens[2]) and torch.equal(
        found.draft_tokens[3], tokens[5]
    )
    assert bool((found.draft_tokens[1:3] == -1).all())
    dense = found.dense_probs()
    assert torch.equal(dense[0], q[2]) and torch.equal(dense[3], q[5])
    assert bool((dense[1:3] == 0).all())
    assert found.point_mass.tolist() == [False] * 4
    assert cache.stats["hits"] == 2 and cache.stats["misses"] == 2


def test_new_round_replaces_the_previous_one() -> None:
    cache = SpeculationCache(V)
    cache.populate("a", *_round(4, seed=0))
    ks, bonus, tokens, q = _round(2, seed=1)
    cache.populate("a", ks + 0, bonus + 30, tokens, q)
    assert cache.num_entries == 2
    assert not cache.lookup(["a"], [int(ks[0])], [10]).hit.item()  # old key gone
    assert cache.lookup(["a"], [int(ks[0])], [40]).hit.item()
    assert cache.remove("a") and not cache.remove("a")
    assert cache.num_entries == 0 and cache.nbytes == 0 and len(cache) == 0


def test_sparse_q_densifies_exactly_and_feeds_verify() -> None:
    cache = SpeculationCache(V)
    ks, bonus, tokens, sparse = _round(6, sparse_k=8)
    tokens = sparse.indices[..., 0].clone()  # a token inside the stored support
    cache.populate("r", ks, bonus, tokens, sparse)
    found = cache.lookup(["r", "r"], ks[:2], bonus[:2])
    dense = found.dense_probs()
    assert torch.equal(dense, sparse[:2].to_dense(V))
    torch.testing.assert_close(dense.sum(-1), torch.ones(2, D))
    assert int((dense > 0).sum(-1).max()) == 8
    result = verify(torch.randn(2, D + 1, V), found.draft_tokens, dense, SamplingBatch.uniform(2))
    assert result.emitted.shape == (2, D + 1)


def test_point_mass_entries_and_mixed_batches() -> None:
    cache = SpeculationCache(V)
    ks, bonus, tokens, q = _round(3)
    cache.populate("ngram", ks, bonus, tokens, None)
    cache.populate("draft", ks, bonus, tokens, q)
    found = cache.lookup(["ngram", "draft", "none"], [0, 0, 0], [10, 10, 10])
    assert found.hit.tolist() == [True, True, False]
    assert found.point_mass.tolist() == [True, False, False]
    dense = found.dense_probs()
    assert bool((dense[0] == 0).all()) and torch.equal(dense[1], q[0])


def test_depth_truncation_and_disagreeing_depths() -> None:
    cache = SpeculationCache(V)
    ks, bonus, tokens, q = _round(2)
    cache.populate("deep", ks, bonus, tokens, q)
    cache.populate("short", ks, bonus, tokens[:, :2], q[:, :2])
    with pytest.raises(ValueError):
        cache.lookup(["deep", "short"], [0, 0], [10, 10])
    found = cache.lookup(["deep", "short"], [0, 0], [10, 10], depth=2)
    assert found.hit.tolist() == [True, True] and found.draft_tokens.shape == (2, 2)
    assert torch.equal(found.dense_probs()[0], q[0, :2])
    assert cache.lookup(["short"], [0], [10], depth=3).hit.tolist() == [False]
    assert cache.lookup([], [], []).draft_tokens.shape == (0, 0)


def test_bounds_evict_least_recently_used_requests() -> None:
    _, _, tokens, q = _round(4)
    per_round = tokens.numel() * 8 + q.numel() * 4
    cache = SpeculationCache(V, max_entries=10, max_bytes=3 * per_round)
    for rid in "abc":
        cache.populate(rid, *_round(4))
    assert len(cache) == 2 and "a" not in cache  # 12 entries > 10: the oldest went
    cache.lookup(["b"], [0], [10])  # a hit refreshes "b"
    cache.populate("d", *_round(4))
    assert "c" not in cache and "b" in cache and "d" in cache
    assert cache.num_entries <= 10 and cache.nbytes <= 3 * per_round
    assert cache.stats["evicted_requests"] == 2


def test_oversized_round_keeps_its_first_entries() -> None:
    cache = SpeculationCache(V, max_entries=3)
    ks, bonus, tokens, q = _round(5)
    cache.populate("a", ks, bonus, tokens, q)
    assert cache.num_entries == 3 and cache.stats["truncated_entries"] == 2
    assert cache.lookup(["a"], ks[2:3], bonus[2:3]).hit.item()
    assert not cache.lookup(["a"], ks[3:4], bonus[3:4]).hit.item()
    byte_bound = SpeculationCache(V, max_bytes=1)
    byte_bound.populate("a", ks, bonus, tokens, q)
    assert byte_bound.num_entries == 0 and "a" not in byte_bound


def test_populate_validates_its_inputs() -> None:
    cache = SpeculationCache(V)
    ks, bonus, tokens, q = _round(4)
    with pytest.raises(ValueError):
        cache.populate("a", ks, bonus, tokens.int(), q)
    with pytest.raises(ValueError):
        cache.populate("a", ks, bonus, tokens, q[:, :, :10])
    with pytest.raises(ValueError):
        cache.populate("a", ks[:3], bonus, tokens, q)
    with pytest.raises(ValueError):
        cache.populate("a", torch.zeros(4, dtype=torch.long), torch.full((4,), 3), tokens, q)
    with pytest.raises(ValueError):
        cache.populate("a", ks, bonus + V, tokens, q)
    with pytest.raises(ValueError):
        SpeculationCache(V, max_entries=0)


def test_dense_probs_keeps_the_stored_dtype() -> None:
    cache = SpeculationCache(V)
    ks, bonus, tokens, q = _round(2)
    cache.populate("a", ks, bonus, tokens, q.bfloat16())
    assert cache.lookup(["a"], ks[:1], bonus[:1]).dense_probs().dtype == torch.bfloat16
    cache.populate("b", ks, bonus, tokens, q)
    with pytest.raises(ValueError):
        cache.lookup(["a", "b"], [0, 0], [10, 10]).dense_probs()

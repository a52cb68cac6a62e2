"""`SamplingBatch`, `apply_sampling` (SGLang's sampler semantics) and `saguaro_probs` (Def. 14)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_ssd.saguaro import SamplingBatch, apply_sampling, saguaro_probs, top_m_from_fanout


def sglang_reference(logits: np.ndarray, t: float, top_k: int, top_p: float, min_p: float = 0.0):
    """One row, written from SGLang's torch sampler (sampler.py, 0.5.23) line by line."""
    if top_k == 1 or t < 1e-6:
        out = np.zeros_like(logits, dtype=np.float64)
        out[np.argmax(logits)] = 1.0
        return out
    z = logits.astype(np.float64) / t
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    ps = p[order]
    csum = np.cumsum(ps)
    keep = np.ones_like(ps, dtype=bool)
    if 0 < top_k < len(p):
        keep &= np.arange(len(p)) < top_k
    keep &= (csum - ps) <= top_p
    ps = ps * keep
    if min_p > 0:
        ps = ps * (ps >= ps[0] * min_p)
    out = np.zeros_like(p)
    out[order] = ps / ps.sum()
    return out


def _batch(params: list[tuple[float, int, float, float]]) -> SamplingBatch:
    t, k, p, m = zip(*params, strict=True)
    return SamplingBatch.from_lists(list(t), list(k), list(p), list(m))


PARAMS = [
    (1.0, -1, 1.0, 0.0),
    (0.7, -1, 1.0, 0.0),
    (1.3, 20, 1.0, 0.0),
    (0.9, -1, 0.8, 0.0),
    (0.6, 5, 0.7, 0.0),
    (1.0, -1, 1.0, 0.05),
    (0.0, -1, 1.0, 0.0),  # greedy by temperature
    (1.0, 1, 1.0, 0.0),  # greedy as SGLang stores it
    (1.0, 1 << 30, 0.95, 0.0),  # TOP_K_ALL
]


@pytest.mark.parametrize("vocab, scale", [(50, 2.0), (3000, 1.0), (3000, 8.0)])
def test_apply_sampling_matches_sglang_semantics(vocab: int, scale: float) -> None:
    # vocab 3000 > the 1024-rank prefix: scale 1 gives wide nuclei (full-sort fallback), scale 8
    # narrow ones (prefix path); both must equal the full-sort reference.
    gen = torch.Generator().manual_seed(vocab)
    logits = scale * torch.randn(len(PARAMS), 3, vocab, generator=gen)
    probs = apply_sampling(logits, _batch(PARAMS))
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    for b, params in enumerate(PARAMS):
        for pos in range(3):
            expected = sglang_reference(logits[b, pos].numpy(), *params)
            np.testing.assert_allclose(probs[b, pos].double().numpy(), expected, atol=2e-6)


def test_top_p_prefix_widening_matches_full_sort() -> None:
    # One row per regime: nucleus < 1024, in (1024, 16384], and > 16384 (the full-sort row).
    vocab = 40_000
    gen = torch.Generator().manual_seed(7)
    scales = torch.tensor([6.0, 3.0, 0.3]).view(3, 1)
    logits = scales * torch.randn(3, vocab, generator=gen)
    sampling = SamplingBatch.uniform(3, 1.0, top_p=0.9)
    probs = apply_sampling(logits, sampling)
    widths = (probs > 0).sum(-1).tolist()
    assert widths[0] <= 1024 < widths[1] <= 16384 < widths[2], widths
    for b in range(3):
        expected = sglang_reference(logits[b].numpy(), 1.0, -1, 0.9)
        np.testing.assert_allclose(probs[b].double().numpy(), expected, atol=2e-6)


def test_apply_sampling_rows_sum_to_one_and_keep_dtype() -> None:
    logits = torch.randn(4, 2, 100, dtype=torch.float64)
    probs = apply_sampling(logits, SamplingBatch.uniform(4, 0.8, top_p=0.9))
    assert probs.dtype == torch.float64
    torch.testing.assert_close(probs.sum(-1), torch.ones(4, 2, dtype=torch.float64))
    bf16 = apply_sampling(logits.bfloat16(), SamplingBatch.uniform(4))
    assert bf16.dtype == torch.float32


def test_greedy_rows_are_one_hot_at_logits_argmax() -> None:
    logits = torch.randn(3, 7, 11)
    probs = apply_sampling(logits, SamplingBatch.from_lists([0.0, 1.0, 0.5], [-1, 1, -1]))
    for b in (0, 1):
        assert torch.equal(probs[b].argmax(-1), logits[b].argmax(-1))
        assert torch.equal(probs[b].max(-1).values, torch.ones(7))
    assert bool((probs[2] > 0).all())


def test_apply_sampling_matches_sglang_sampler_itself() -> None:
    """SSD's p is SGLang's sampler's own filtered distribution (SGLang is installed in CI)."""
    from sglang.srt.layers import sampler

    logits = 3 * torch.randn(6, 2000, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([1.0, 0.7, 1.2, 0.9, 0.5, 1.0])
    k = torch.tensor([1 << 30, 40, 1 << 30, 7, 1 << 30, 100])
    p = torch.tensor([1.0, 1.0, 0.9, 0.6, 0.95, 0.5])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.0])
    base = torch.softmax(logits / t.view(-1, 1), dim=-1)
    _, probs_sort, probs_idx, _ = sampler.top_k_top_p_min_p_sampling_from_probs_torch(
        base.clone(), k, p, min_p, True, None, None, return_filtered_probs=True
    )
    expected = torch.zeros_like(base).scatter_(1, probs_idx.long(), probs_sort)
    expected /= expected.sum(-1, keepdim=True)
    got = apply_sampling(logits, SamplingBatch(t, k, p, min_p))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=torch.tensor([-1.0]), top_k=torch.tensor([1]), top_p=torch.tensor([1.0])),
        dict(temperature=torch.tensor([1.0]), top_k=torch.tensor([0]), top_p=torch.tensor([1.0])),
        dict(temperature=torch.tensor([1.0]), top_k=torch.tensor([5]), top_p=torch.tensor([0.0])),
        dict(temperature=torch.tensor([1.0]), top_k=torch.tensor([5.0]), top_p=torch.tensor([1.0])),
        dict(
            temperature=torch.tensor([1.0, 2.0]), top_k=torch.tensor([5]), top_p=torch.tensor([1.0])
        ),
        dict(temperature=torch.tensor([[1.0]]), top_k=torch.tensor([5]), top_p=torch.tensor([1.0])),
    ],
)
def test_sampling_batch_rejects_bad_values(kwargs) -> None:
    with pytest.raises(ValueError):
        SamplingBatch(**kwargs)


def test_sampling_batch_helpers() -> None:
    batch = SamplingBatch.from_lists([0.0, 1.0, 0.7], [-1, 1, 50])
    assert batch.is_greedy.tolist() == [True, True, False]
    assert batch.select(torch.tensor([2])).top_k.tolist() == [50]
    assert batch.select(slice(None)) is batch
    assert batch.to("cpu") is batch
    with pytest.raises(ValueError):
        apply_sampling(torch.randn(2, 10), batch)


# ---- Saguaro sampling (Definition 14) ----------------------------------------------------------


def test_saguaro_scales_top_m_by_beta_exactly() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 30, generator=gen)
    sampling = SamplingBatch.uniform(4, 0.9, top_k=20)
    top_m, beta = [4, 2, 1], 0.3
    p = apply_sampling(logits, sampling)
    q = saguaro_probs(logits, top_m, beta, sampling)
    torch.testing.assert_close(q.sum(-1), torch.ones(4, 3))
    assert torch.equal(q == 0, p == 0)  # top-k filtered tokens stay at 0
    ratio = torch.where(p > 0, q / p, torch.nan)
    order = p.argsort(dim=-1, descending=True)
    for j, m in enumerate(top_m):
        sorted_ratio = ratio[:, j].gather(1, order[:, j])
        top, rest = sorted_ratio[:, :m], sorted_ratio[:, m:20]
        torch.testing.assert_close(top, beta * rest[:, :1].expand_as(top))
        torch.testing.assert_close(rest, rest[:, :1].expand_as(rest))


def test_saguaro_matches_definition_14_on_logits() -> None:
    z = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    beta, m = 0.25, 2
    weights = torch.exp(z) * torch.tensor([[beta, beta, 1, 1, 1]])
    q = saguaro_probs(z, m, beta, SamplingBatch.uniform(1))
    torch.testing.assert_close(q, weights / weights.sum())


def test_saguaro_top_m_shapes_and_edges() -> None:
    logits = torch.randn(3, 4, 12)
    sampling = SamplingBatch.uniform(3)
    p = apply_sampling(logits, sampling)
    per_depth = saguaro_probs(logits, torch.tensor([1, 2, 3, 4]), 0.5, sampling)
    per_row = saguaro_probs(logits, torch.tensor([[1], [2], [3]]), 0.5, sampling)
    full = saguaro_probs(logits, torch.tensor([[1, 2, 3, 4]] * 3), 0.5, sampling)
    assert torch.equal(per_depth, full)
    assert per_row.shape == logits.shape
    rows = saguaro_probs(logits[:, 0], [1, 2, 3], 0.5, sampling)
    torch.testing.assert_close(
        rows[1], saguaro_probs(logits[1:2, 0], 2, 0.5, sampling.select([1]))[0]
    )
    assert torch.equal(saguaro_probs(logits, 0, 0.5, sampling), p)
    torch.testing.assert_close(saguaro_probs(logits, 12, 0.5, sampling), p)
    assert torch.equal(saguaro_probs(logits, 3, 1.0, sampling), p)


def test_saguaro_leaves_greedy_rows_unchanged() -> None:
    logits = torch.randn(2, 10)
    sampling = SamplingBatch.from_lists([0.0, 1.0])
    q = saguaro_probs(logits, 3, 0.2, sampling)
    assert torch.equal(q[0], apply_sampling(logits, sampling)[0])
    assert q[0].max() == 1.0
    assert not torch.equal(q[1], apply_sampling(logits, sampling)[1])


@pytest.mark.parametrize("beta", [0.0, -0.5, 1.5, float("nan")])
def test_saguaro_rejects_beta_outside_unit_interval(beta: float) -> None:
    with pytest.raises(ValueError):
        saguaro_probs(torch.randn(2, 5), 1, beta, SamplingBatch.uniform(2))


@pytest.mark.parametrize(
    "top_m", [-1, torch.tensor([1, 2, 3]), torch.ones(2, 2, 2, dtype=torch.long)]
)
def test_saguaro_rejects_bad_top_m(top_m) -> None:
    with pytest.raises(ValueError):
        saguaro_probs(torch.randn(2, 5), top_m, 0.5, SamplingBatch.uniform(2))


def test_top_m_from_fanout_is_f_plus_one_without_f_gamma() -> None:
    assert top_m_from_fanout([3, 3, 3, 3, 8]) == [4, 4, 4, 4]
    assert top_m_from_fanout([5]) == []
    with pytest.raises(ValueError):
        top_m_from_fanout([])
    with pytest.raises(ValueError):
        top_m_from_fanout([1, -1])

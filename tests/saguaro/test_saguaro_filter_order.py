"""The order of top-k, top-p and min-p (`SamplingBatch.filter_order`): "joint" as SGLang's torch
sampler, "sequential" as its FlashInfer backend filters a batch that needs min-p (the default on
CUDA), each checked against a reference written from SGLang 0.5.23's code
(sglang/srt/layers/sampler.py `Sampler._sample_from_probs`)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_ssd.saguaro import SamplingBatch, apply_sampling, filter_order


def sequential_reference(logits: np.ndarray, t: float, top_k: int, top_p: float, min_p: float):
    """One row as the flashinfer branch with `need_min_p_sampling` filters it, line by line:
    `top_k_renorm_prob` (keep the top k, renormalise), `top_p_renorm_prob` (keep the tokens at
    or above the threshold whose mass reaches top_p, renormalise), `min_p_sampling_from_probs`
    (drop tokens below min_p times the largest, sample from the rest)."""
    z = logits.astype(np.float64) / t
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    ps = p[order]
    if 0 < top_k < len(ps):
        ps[top_k:] = 0.0
    ps /= ps.sum()
    if top_p < 1.0:
        reached = int(np.searchsorted(np.cumsum(ps), top_p))  # first rank whose mass >= top_p
        ps[reached + 1 :] = 0.0
    ps /= ps.sum()
    ps = ps * (ps >= ps[0] * min_p)
    out = np.zeros_like(p)
    out[order] = ps / ps.sum()
    return out


def _probs(values: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor([values]))


def test_the_issue_example_differs_between_the_orders() -> None:
    """p = [0.4, 0.3, 0.2, 0.1], top_k 2, top_p 0.5, min_p 0.01: plain decoding on a CUDA
    server (sequential) emits token 0 only; the joint order keeps token 1 at 3/7."""
    logits = _probs([0.4, 0.3, 0.2, 0.1])
    for order, expected in (("sequential", [1.0, 0.0, 0.0, 0.0]), ("joint", [4 / 7, 3 / 7, 0, 0])):
        sampling = replace(SamplingBatch.from_lists([1.0], [2], [0.5], [0.01]), filter_order=order)
        got = apply_sampling(logits, sampling)[0]
        torch.testing.assert_close(got, torch.tensor(expected), atol=1e-6, rtol=0)


PARAMS = [
    (1.0, 2, 0.5, 0.01),
    (0.7, 40, 0.9, 0.05),
    (1.3, -1, 0.8, 0.1),
    (0.9, 10, 1.0, 0.2),
    (1.0, -1, 1.0, 0.0),  # no filter asked: the plain tempered softmax
    (0.5, 5, 0.6, 0.0),  # in a min-p batch without min-p itself: still sequential
]


@pytest.mark.parametrize("vocab, scale", [(60, 2.0), (3000, 1.0), (3000, 6.0)])
def test_sequential_order_matches_the_reference(vocab: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(vocab + int(scale))
    logits = scale * torch.randn(len(PARAMS), vocab, generator=gen, dtype=torch.float64)
    t, k, p, m = (list(column) for column in zip(*PARAMS, strict=True))
    sampling = replace(SamplingBatch.from_lists(t, k, p, m), filter_order="sequential")
    probs = apply_sampling(logits, sampling)
    for row, params in enumerate(PARAMS):
        expected = sequential_reference(logits[row].numpy(), *params)
        np.testing.assert_allclose(probs[row].numpy(), expected, atol=1e-9)


def test_each_backend_gets_sglangs_order() -> None:
    assert filter_order("flashinfer", needs_min_p=True) == "sequential"
    assert filter_order("intel_xpu", needs_min_p=True) == "sequential"
    assert filter_order("flashinfer", needs_min_p=False) == "joint"
    assert filter_order("pytorch", needs_min_p=True) == "joint"
    assert filter_order("ascend", needs_min_p=True) == "joint"


def test_the_order_survives_select_and_to_and_is_checked() -> None:
    base = SamplingBatch.from_lists([1.0, 0.5], [2, 3], [0.5, 0.9], [0.1, 0.0])
    sampling = replace(base, filter_order="sequential")
    assert sampling.select(torch.tensor([1])).filter_order == "sequential"
    assert sampling.to("cpu").filter_order == "sequential"
    with pytest.raises(ValueError, match="filter_order"):
        replace(base, filter_order="top_k_first")


def test_the_worker_reads_the_servers_backend() -> None:
    """`ssd_worker._sampling_of` builds p's parameters from SGLang's `SamplingBatchInfo` fields
    and the server's resolved `--sampling-backend`."""
    from sglang_ssd.worker.ssd_worker import _sampling_of

    params = [(1.0, 2, 0.5, 0.01), (0.7, 40, 0.9, 0.0)]
    reqs = [
        SimpleNamespace(sampling_params=SimpleNamespace(temperature=t, top_k=k, top_p=p, min_p=m))
        for t, k, p, m in params
    ]
    info = SimpleNamespace(need_min_p_sampling=True)
    batch = SimpleNamespace(reqs=reqs, sampling_info=info)
    assert _sampling_of(batch, "flashinfer").filter_order == "sequential"
    assert _sampling_of(batch, "pytorch").filter_order == "joint"
    info.need_min_p_sampling = False
    without = _sampling_of(batch, "flashinfer")
    assert without.filter_order == "joint" and without.min_p is None

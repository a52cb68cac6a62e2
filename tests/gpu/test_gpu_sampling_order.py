"""p's filters in the order SGLang's CUDA sampler applies them, on the GPU.

SGLang 0.5.23's default CUDA sampling backend ("flashinfer") filters a batch that needs min-p
with `top_k_renorm_prob`, then `top_p_renorm_prob`, then `min_p_sampling_from_probs`
(sglang/srt/layers/sampler.py:402-411). `apply_sampling` with `filter_order="sequential"` must
give the distribution those FlashInfer calls sample from. Checked by drawing from FlashInfer's
own functions on the GPU (skipped where flashinfer is not installed) and comparing the
frequencies with our p: the example (token 1 must never appear) and random rows.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sglang_ssd.saguaro import SamplingBatch, apply_sampling

pytestmark = pytest.mark.gpu
DRAWS = 20000


def _flashinfer_draws(probs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """int64 [DRAWS] tokens sampled as SGLang's flashinfer branch samples one row."""
    sampling = pytest.importorskip("flashinfer.sampling")
    top_k_renorm = getattr(sampling, "top_k_renorm_prob", None) or sampling.top_k_renorm_probs
    top_p_renorm = getattr(sampling, "top_p_renorm_prob", None) or sampling.top_p_renorm_probs
    rows = probs.expand(DRAWS, -1).contiguous()
    rows = top_k_renorm(rows, top_k)
    rows = top_p_renorm(rows, top_p)
    min_ps = torch.full((DRAWS,), min_p, device=probs.device)
    return sampling.min_p_sampling_from_probs(rows, min_ps).long()


@pytest.mark.parametrize(
    ("logits", "top_k", "top_p", "min_p"),
    [
        pytest.param(torch.tensor([0.4, 0.3, 0.2, 0.1]).log(), 2, 0.5, 0.01, id="issue-example"),
        pytest.param(
            torch.randn(64, generator=torch.Generator().manual_seed(0)), 20, 0.8, 0.05, id="random"
        ),
    ],
)
def test_sequential_p_is_what_flashinfer_samples(
    cuda: torch.device, logits: torch.Tensor, top_k: int, top_p: float, min_p: float,
    record_property,
) -> None:  # fmt: skip
    sampling = replace(
        SamplingBatch.from_lists([1.0], [top_k], [top_p], [min_p], device=cuda),
        filter_order="sequential",
    )
    p = apply_sampling(logits.to(cuda).view(1, -1), sampling)[0].double()
    draws = _flashinfer_draws(torch.softmax(logits.to(cuda), -1).view(1, -1), top_k, top_p, min_p)
    freq = torch.bincount(draws, minlength=p.numel()).double() / DRAWS
    assert bool((freq[p == 0] == 0).all()), "FlashInfer drew a token our p excludes"
    bound = 5 * (p * (1 - p) / DRAWS).sqrt() + 1e-3  # 5 sigma per token
    worst = ((freq - p).abs() - bound).max().item()
    assert worst <= 0, f"frequencies off our p by more than 5 sigma (excess {worst:.4f})"
    record_property("detail", f"{DRAWS} FlashInfer draws within 5 sigma of p")

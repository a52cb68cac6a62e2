"""`verify(..., uniforms=...)`: given uniforms replace the generator's draws, exactly.

The CUDA-vs-CPU check (tests/gpu/test_gpu_verify.py) rests on this: with the same uniforms both
devices make the same decisions. Here, on the CPU: drawn the way verify draws them, the given
uniforms reproduce the generator path bit for bit; chosen by hand, the result is the naive
speculative-sampling reference (Leviathan et al. 2023, Algorithm 1) evaluated on them.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.saguaro import SamplingBatch, VerifyUniforms, apply_sampling, verify


def _case(batch: int, depth: int, vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, depth + 1, vocab, generator=gen)
    q = torch.softmax(logits[:, :depth] + torch.randn(batch, depth, vocab, generator=gen), -1)
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(batch, depth)
    return logits, tokens, q


def _same(a, b) -> bool:
    return all(
        torch.equal(getattr(a, n), getattr(b, n)) for n in ("accept_len", "bonus_token", "emitted")
    )


@pytest.mark.parametrize("depth", [0, 3])
def test_drawn_uniforms_equal_the_generator_path(depth: int) -> None:
    logits, tokens, q = _case(64, depth, 50, seed=depth)
    sampling = SamplingBatch.uniform(64, temperature=0.9)
    point_mass = torch.arange(64) % 4 == 3
    by_generator = verify(
        logits, tokens, q, sampling, point_mass, torch.Generator().manual_seed(11)
    )
    uniforms = VerifyUniforms.draw(64, depth, torch.Generator().manual_seed(11))
    given = verify(logits, tokens, q, sampling, point_mass, uniforms=uniforms)
    assert _same(given, by_generator)


def _reference(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, u: VerifyUniforms):
    """Row by row: accept d_j iff u_j q(d_j) < p(d_j); the bonus is the first index whose CDF
    of max(p - q, 0) (or of p after all D) exceeds bonus_u times its total."""
    out = []
    for b in range(tokens.shape[0]):
        k = 0
        while k < tokens.shape[1]:
            x = int(tokens[b, k])
            if not float(u.accept[b, k]) * float(q[b, k, x]) < float(p[b, k, x]):
                break
            k += 1
        weights = p[b, k].double()
        if k < tokens.shape[1]:
            weights = (weights - q[b, k].double()).clamp(min=0)
        cdf = weights.cumsum(0)
        bonus = int((cdf > float(u.bonus[b]) * float(cdf[-1])).nonzero()[0])
        out.append((k, bonus))
    return out


def test_chosen_uniforms_give_the_reference_outcome() -> None:
    logits, tokens, q = _case(6, 3, 8, seed=5)
    sampling = SamplingBatch.uniform(6)
    # Rows 0-1 accept everything (u = 0), rows 2-3 reject at once unless p >= q, 4-5 mixed.
    accept = torch.tensor([[0.0] * 3] * 2 + [[0.999999] * 3] * 2 + [[0.1, 0.95, 0.5]] * 2)
    bonus = torch.tensor([0.0, 0.999, 0.3, 0.7, 0.5, 0.05], dtype=torch.float64)
    uniforms = VerifyUniforms(accept, bonus)
    result = verify(logits, tokens, q, sampling, uniforms=uniforms)
    expected = _reference(apply_sampling(logits, sampling), q, tokens, uniforms)
    pairs = zip(result.accept_len.tolist(), result.bonus_token.tolist(), strict=True)
    assert list(pairs) == expected
    assert result.accept_len[:2].tolist() == [3, 3]


def test_uniforms_are_not_ignored() -> None:
    logits, tokens, q = _case(32, 4, 50, seed=1)
    sampling = SamplingBatch.uniform(32)
    low = VerifyUniforms(torch.zeros(32, 4), torch.zeros(32, dtype=torch.float64))
    high = VerifyUniforms(torch.full((32, 4), 0.999999), torch.full((32,), 0.999999).double())
    all_in = verify(logits, tokens, q, sampling, uniforms=low)
    assert all_in.accept_len.tolist() == [4] * 32  # p(x) > 0 everywhere: u = 0 accepts all
    assert not _same(all_in, verify(logits, tokens, q, sampling, uniforms=high))


def test_greedy_rows_ignore_uniforms_and_bad_shapes_raise() -> None:
    logits, tokens, q = _case(8, 2, 20, seed=2)
    greedy = SamplingBatch.uniform(8, temperature=0.0, top_k=1)
    low = VerifyUniforms(torch.zeros(8, 2), torch.zeros(8, dtype=torch.float64))
    assert _same(verify(logits, tokens, q, greedy, uniforms=low), verify(logits, tokens, q, greedy))
    with pytest.raises(ValueError, match="accept shape"):
        verify(logits, tokens, q, greedy, uniforms=VerifyUniforms(torch.zeros(8, 3), low.bonus))
    with pytest.raises(ValueError, match="float64"):
        verify(logits, tokens, q, greedy, uniforms=VerifyUniforms(low.accept, low.bonus.float()))

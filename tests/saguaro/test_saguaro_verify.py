"""`verify` contracts: shapes, row types, edge cases, validation, devices
(docs/design.md#exactness-rules)."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from sglang_ssd.saguaro import SamplingBatch, apply_sampling, verify
from sglang_ssd.saguaro.verify import _sample_rows


def _inputs(batch: int, depth: int, vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(batch, depth + 1, vocab, generator=gen)
    draft_probs = torch.softmax(torch.randn(batch, depth, vocab, generator=gen), dim=-1)
    flat = draft_probs.reshape(-1, vocab)
    tokens = torch.multinomial(flat, 1, generator=gen).reshape(batch, depth)
    return target_logits, tokens, draft_probs


def test_result_layout() -> None:
    target_logits, tokens, q = _inputs(64, 4, 50)
    result = verify(
        target_logits, tokens, q, SamplingBatch.uniform(64), generator=torch.Generator()
    )
    assert (
        result.accept_len.dtype == result.bonus_token.dtype == result.emitted.dtype == torch.int64
    )
    assert result.emitted.shape == (64, 5)
    assert bool(((result.accept_len >= 0) & (result.accept_len <= 4)).all())
    for b in range(64):
        k = int(result.accept_len[b])
        assert result.emitted[b, :k].tolist() == tokens[b, :k].tolist()
        assert int(result.emitted[b, k]) == int(result.bonus_token[b])
        assert bool((result.emitted[b, k + 1 :] == -1).all())
    torch.testing.assert_close(result.num_emitted, result.accept_len + 1)


def test_greedy_rows_accept_iff_argmax_and_bonus_is_argmax() -> None:
    target_logits, tokens, q = _inputs(32, 4, 40)
    argmax = target_logits.argmax(-1)
    tokens[:16, :2] = argmax[:16, :2]  # the first two positions match for half the rows
    tokens[:16, 2] = (argmax[:16, 2] + 1) % 40
    sampling = SamplingBatch.from_lists([0.0] * 16 + [1.0] * 16, [-1] * 16 + [1] * 16)
    result = verify(target_logits, tokens, q, sampling)
    matches = (tokens == argmax[:, :4]).long().cumprod(1).sum(1)
    assert torch.equal(result.accept_len, matches)
    assert result.accept_len[:16].tolist() == [2] * 16
    assert torch.equal(result.bonus_token, argmax.gather(1, matches.unsqueeze(1)).squeeze(1))


def test_mixed_batch_equals_its_parts() -> None:
    """Greedy and sampled rows in one call give what each group gives alone (same RNG stream)."""
    target_logits, tokens, q = _inputs(12, 3, 40, seed=3)
    greedy = torch.tensor([True, False, False] * 4)
    temperature = torch.where(greedy, 0.0, 0.8)
    sampling = SamplingBatch(temperature, torch.full((12,), 30), torch.full((12,), 0.9))
    point_mass = torch.tensor([False, True, False, False] * 3)
    mixed = verify(target_logits, tokens, q, sampling, point_mass, torch.Generator().manual_seed(1))
    for rows in (greedy.nonzero().squeeze(1), (~greedy).nonzero().squeeze(1)):
        alone = verify(
            target_logits[rows],
            tokens[rows],
            q[rows],
            sampling.select(rows),
            point_mass[rows],
            torch.Generator().manual_seed(1),
        )
        assert torch.equal(mixed.emitted[rows], alone.emitted)


def test_identical_draft_and_target_accepts_everything() -> None:
    target_logits, _, _ = _inputs(256, 3, 20)
    sampling = SamplingBatch.uniform(256, 0.7, top_p=0.9)
    p = apply_sampling(target_logits, sampling)
    tokens = torch.multinomial(p[:, :3].reshape(-1, 20), 1).reshape(256, 3)
    result = verify(target_logits, tokens, p[:, :3].clone(), sampling)
    assert result.accept_len.tolist() == [3] * 256  # u * q < p with q == p always holds


def test_point_mass_rows_ignore_their_q_and_never_rebonus_x() -> None:
    target_logits, tokens, q = _inputs(4000, 1, 6)
    q_garbage = torch.zeros_like(q)  # would accept everything if used (u * 0 < p)
    point_mass = torch.ones(4000, dtype=torch.bool)
    result = verify(target_logits, tokens, q_garbage, SamplingBatch.uniform(4000), point_mass)
    rejected = result.accept_len == 0
    assert 0 < int(rejected.sum()) < 4000
    assert not bool((result.bonus_token[rejected] == tokens[rejected, 0]).any())
    none_q = verify(target_logits, tokens, None, SamplingBatch.uniform(4000), None)
    assert 0 < int((none_q.accept_len == 0).sum()) < 4000


def test_point_mass_acceptance_rate_is_p_of_x() -> None:
    vocab, n = 5, 100_000
    logits = torch.tensor([1.0, 0.0, -1.0, 0.5, 2.0]).expand(n, 2, vocab).contiguous()
    tokens = torch.full((n, 1), 3, dtype=torch.int64)
    result = verify(logits, tokens, None, SamplingBatch.uniform(n), generator=torch.Generator())
    p3 = torch.softmax(logits[0, 0], -1)[3].item()
    rate = result.accept_len.double().mean().item()
    assert abs(rate - p3) < 4 * (p3 * (1 - p3) / n) ** 0.5


def test_depth_zero_samples_one_token_from_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2])).expand(100_000, 1, 3).contiguous()
    empty = torch.zeros(100_000, 0, dtype=torch.int64)
    result = verify(
        logits, empty, None, SamplingBatch.uniform(100_000), generator=torch.Generator()
    )
    assert result.emitted.shape == (100_000, 1) and result.accept_len.eq(0).all()
    counts = torch.bincount(result.bonus_token, minlength=3).numpy()
    assert stats.chisquare(counts, [50_000, 30_000, 20_000]).pvalue > 1e-3
    with_q = verify(logits[:4], empty[:4], torch.zeros(4, 0, 3), SamplingBatch.uniform(4))
    assert with_q.emitted.shape == (4, 1)


def test_masked_logits_are_never_emitted() -> None:
    """-inf logits (grammar masks, applied before verify) give p = 0: never accepted or bonus."""
    target_logits, tokens, q = _inputs(2000, 2, 8)
    target_logits[..., 5:] = float("-inf")
    tokens[:, 0] = 6  # always rejected: p(6) = 0
    for temperature in (1.0, 0.0):
        result = verify(target_logits, tokens, q, SamplingBatch.uniform(2000, temperature))
        assert bool((result.accept_len == 0).all())
        assert bool((result.bonus_token < 5).all())


def test_generator_makes_verify_reproducible() -> None:
    target_logits, tokens, q = _inputs(16, 4, 30)
    sampling = SamplingBatch.uniform(16, 0.8)
    a = verify(target_logits, tokens, q, sampling, generator=torch.Generator().manual_seed(5))
    b = verify(target_logits, tokens, q, sampling, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.emitted, b.emitted)


def test_low_precision_q_is_widened_not_refused() -> None:
    target_logits, tokens, q = _inputs(8, 2, 30)
    result = verify(target_logits.bfloat16(), tokens, q.bfloat16(), SamplingBatch.uniform(8))
    assert result.emitted.shape == (8, 3)


def test_sample_rows_never_picks_zero_weight_and_follows_weights() -> None:
    weights = torch.tensor([[0.0, 2.0, 0.0, 6.0, 0.0]]).expand(80_000, 5)
    picks = _sample_rows(weights, torch.Generator().manual_seed(0))
    counts = torch.bincount(picks, minlength=5)
    assert counts[[0, 2, 4]].sum() == 0
    assert stats.chisquare(counts[[1, 3]].numpy(), [20_000, 60_000]).pvalue > 1e-3
    tail = torch.zeros(1, 151_936)
    tail[0, 7] = 1.0
    assert _sample_rows(tail, None).item() == 7
    # Across the two levels: block edges (1023 | 1024) and a partial last block (2048..2099).
    spread = torch.zeros(10_000, 2100)
    support = torch.tensor([5, 1023, 1024, 2047, 2099])
    spread[:, support] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    picks = _sample_rows(spread, torch.Generator().manual_seed(1))
    counts = torch.bincount(picks, minlength=2100)
    assert counts.sum() == counts[support].sum()
    expected = [10_000 * w / 15 for w in (1, 2, 3, 4, 5)]
    assert stats.chisquare(counts[support].numpy(), expected).pvalue > 1e-3


@pytest.mark.parametrize(
    "case",
    [
        "logits_2d",
        "logits_int",
        "tokens_int32",
        "tokens_shape",
        "tokens_range",
        "probs_shape",
        "point_mass_dtype",
        "point_mass_shape",
        "sampling_size",
    ],
)
def test_invalid_inputs_raise_value_error(case: str) -> None:
    target_logits, tokens, q = _inputs(4, 3, 10)
    args = dict(
        target_logits=target_logits,
        draft_tokens=tokens,
        draft_probs=q,
        sampling=SamplingBatch.uniform(4),
        point_mass=None,
    )
    bad = {
        "logits_2d": dict(target_logits=target_logits[:, 0]),
        "logits_int": dict(target_logits=target_logits.long()),
        "tokens_int32": dict(draft_tokens=tokens.int()),
        "tokens_shape": dict(draft_tokens=tokens[:, :2]),
        "tokens_range": dict(draft_tokens=tokens + 10),
        "probs_shape": dict(draft_probs=q[:, :, :5]),
        "point_mass_dtype": dict(point_mass=torch.zeros(4, dtype=torch.long)),
        "point_mass_shape": dict(point_mass=torch.zeros(3, dtype=torch.bool)),
        "sampling_size": dict(sampling=SamplingBatch.uniform(3)),
    }[case]
    args.update(bad)
    with pytest.raises(ValueError):
        verify(**args)

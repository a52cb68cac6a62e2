"""`sglang_ssd.saguaro.verify` on CUDA against the CPU (docs/design.md#exactness-rules, exactness
rules).

Greedy rows must match the CPU bit for bit. Given the same uniforms (`VerifyUniforms`, drawn on
the CPU) sampled rows must too, except where |u - min(1, p/q)| < 1e-5 (or a bonus uniform within
1e-5 of a residual-CDF boundary), which the check lists. With each device's own generator the
RNG streams differ, so those rows are compared statistically: each device must be lossless (the
first emitted token ~ p, P(accept >= 1) = sum min(p, q)) and the two accept-length distributions
must agree, all within `SIGMAS` standard errors.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.saguaro import SamplingBatch, VerifyResult, VerifyUniforms, apply_sampling, verify

pytestmark = pytest.mark.gpu

SIGMAS = 5.0
PER_CASE = 20000  # rows per (p, q) case in the sampled checks
TIE_EPS = 1e-5  # |u - min(1, p/q)| below this may decide differently on the two devices


def test_greedy_cuda_equals_cpu(cuda: torch.device, record_property) -> None:
    gen = torch.Generator().manual_seed(0)
    batch, depth, vocab = 256, 5, 151936 // 8
    logits = torch.randn(batch, depth + 1, vocab, generator=gen)
    drafts = torch.randint(0, vocab, (batch, depth), generator=gen)
    # Most draft tokens are the argmax so that accept lengths spread over 0..D.
    take_argmax = torch.rand(batch, depth, generator=gen) < 0.8
    drafts = torch.where(take_argmax, logits[:, :depth].argmax(-1), drafts)
    sampling = SamplingBatch.uniform(batch, temperature=0.0, top_k=1)
    cpu = verify(logits, drafts, None, sampling)
    on_cuda = verify(logits.to(cuda), drafts.to(cuda), None, sampling.to(cuda))
    for name in ("accept_len", "bonus_token", "emitted"):
        a, b = getattr(cpu, name), getattr(on_cuda, name).cpu()
        bad = (a != b).reshape(batch, -1).any(1).nonzero().squeeze(1)[:5].tolist()
        assert torch.equal(a, b), f"{name} differs CPU vs CUDA in rows {bad}"
    hist = torch.bincount(cpu.accept_len, minlength=depth + 1).tolist()
    record_property("detail", f"{batch} rows x D={depth}, V={vocab}: identical; accept_len {hist}")


def test_cuda_equals_cpu_given_uniforms(cuda: torch.device, record_property) -> None:
    """Sampled, top-p, point-mass and greedy rows at V = 32k: the same CPU-drawn uniforms give
    the same tokens on both devices except at listed near-ties; p agrees within atol 1e-6."""
    gen = torch.Generator().manual_seed(3)
    batch, depth, vocab = 512, 4, 32_000
    logits = torch.randn(batch, depth + 1, vocab, generator=gen) * 2
    q = torch.softmax(logits[:, :depth] + torch.randn(batch, depth, vocab, generator=gen), -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(batch, depth)
    point_mass = torch.arange(batch) % 5 == 4
    temps = [0.0 if i % 8 == 0 else 0.7 + 0.1 * (i % 4) for i in range(batch)]
    sampling = SamplingBatch.from_lists(
        temps, top_p=[0.9 if i % 3 == 0 else 1.0 for i in range(batch)]
    )
    uniforms = VerifyUniforms.draw(batch, depth, torch.Generator().manual_seed(4))
    cpu = verify(logits, drafts, q, sampling, point_mass, uniforms=uniforms)
    on_cuda = verify(
        logits.to(cuda),
        drafts.to(cuda),
        q.to(cuda),
        sampling.to(cuda),
        point_mass.to(cuda),
        uniforms=uniforms,
    )
    p = apply_sampling(logits, sampling)
    torch.testing.assert_close(
        apply_sampling(logits.to(cuda), sampling.to(cuda)).cpu(), p, atol=1e-6, rtol=0
    )
    p_x = p[:, :depth].gather(2, drafts.unsqueeze(2)).squeeze(2).double()
    q_x = torch.where(point_mass.unsqueeze(1), 1.0, q.gather(2, drafts.unsqueeze(2)).squeeze(2))
    gap = (uniforms.accept.double() - (p_x / q_x.double()).clamp(max=1.0)).abs()  # [B, D]
    near = (gap < TIE_EPS) & ~sampling.is_greedy.unsqueeze(1)
    ties = near.nonzero().tolist()
    differ = (cpu.emitted != on_cuda.emitted.cpu()).any(1).nonzero().squeeze(1).tolist()
    for b in differ:
        k = min(int(cpu.accept_len[b]), int(on_cuda.accept_len[b]))
        if int(cpu.accept_len[b]) == int(on_cuda.accept_len[b]):
            weights = p[b, k].double().clone()
            if k < depth and bool(point_mass[b]):
                weights[int(drafts[b, k])] = 0.0
            elif k < depth:
                weights = (weights - q[b, k].double()).clamp(min=0.0)
            cdf = weights.cumsum(0) / weights.sum()
            bonus_gap = float((cdf - float(uniforms.bonus[b])).abs().min())
            assert bonus_gap < TIE_EPS, f"row {b}: bonus differs, u {bonus_gap:.1e} from the CDF"
            ties.append([b, k, "bonus"])
            continue
        assert k < depth and bool(near[b, k]), (
            f"row {b} differs (CPU {cpu.emitted[b].tolist()} vs CUDA "
            f"{on_cuda.emitted[b].tolist()}) with no near-tie at its first disagreement"
        )
    hist = torch.bincount(cpu.accept_len, minlength=depth + 1).tolist()
    record_property(
        "detail",
        f"{batch} rows x D={depth}, V={vocab}: differing rows {differ}, near-tie (row, j) {ties},"
        f" accept_len {hist}",
    )


@pytest.mark.parametrize("device_name", ["cpu", "cuda"])
def test_sampled_is_lossless(device_name: str, request: pytest.FixtureRequest, record_property):
    device = request.getfixturevalue("cuda") if device_name == "cuda" else torch.device("cpu")
    target, drafts, q_rows, point_mass, p, q = _sampled_case(PER_CASE, seed=1)
    result = _verify_sampled(target, drafts, q_rows, point_mass, device, seed=123)
    worst = _check_lossless(result, point_mass, p, q, device_name)
    record_property("detail", f"{target.shape[0]} rows: within {worst:.2f} sigma (limit {SIGMAS})")


def test_sampled_cuda_matches_cpu_distribution(cuda: torch.device, record_property) -> None:
    target, drafts, q_rows, point_mass, _, _ = _sampled_case(PER_CASE, seed=2)
    rows = target.shape[0]
    hists = []
    for device in (torch.device("cpu"), cuda):
        result = _verify_sampled(target, drafts, q_rows, point_mass, device, seed=7)
        hists.append(torch.bincount(result.accept_len.cpu(), minlength=4).double() / rows)
    a, b = hists
    sigma = ((a * (1 - a) / rows) * 2).sqrt() + 1e-4
    z = ((a - b).abs() / sigma).max().item()
    assert z <= SIGMAS, f"accept_len histograms differ by {z:.1f} sigma: {a} vs {b}"
    record_property("detail", f"accept_len CPU {a.tolist()} vs CUDA within {z:.2f} sigma")


def test_mixed_batch_stays_on_device_and_p_matches_cpu(cuda: torch.device, record_property) -> None:
    """Greedy and top-p rows in one batch at the real vocabulary: the result stays on CUDA, its
    greedy rows equal the CPU's, and `apply_sampling` (p) agrees with the CPU's."""
    gen = torch.Generator().manual_seed(0)
    batch, depth, vocab = 64, 4, 151_936
    logits = torch.randn(batch, depth + 1, vocab, generator=gen)
    q = torch.softmax(torch.randn(batch, depth, vocab, generator=gen), dim=-1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(batch, depth)
    sampling = SamplingBatch.from_lists([0.0] * 32 + [0.8] * 32, top_p=[1.0] * 32 + [0.95] * 32)
    cpu = verify(logits, drafts, q, sampling)
    on_cuda = verify(
        logits.to(cuda),
        drafts.to(cuda),
        q.to(cuda),
        sampling.to(cuda),
        None,
        torch.Generator(device=cuda).manual_seed(0),
    )
    assert on_cuda.emitted.device.type == "cuda"
    assert torch.equal(on_cuda.emitted[:32].cpu(), cpu.emitted[:32])
    torch.testing.assert_close(
        apply_sampling(logits.to(cuda), sampling.to(cuda)).cpu(),
        apply_sampling(logits, sampling),
        atol=1e-6,
        rtol=1e-4,
    )
    record_property("detail", f"{batch} rows (32 greedy, 32 top-p) x V={vocab}: greedy equal")


def _sampled_case(batch_per_case: int, seed: int):
    """4 (p, q) pairs replicated; drafts sampled from q with their own CPU generator.

    Returns target logits [B, D + 1, V], drafts int64 [B, D], q rows [B, D, V], point_mass
    bool [B], and the per-case p [4, D + 1, V] and q [4, D, V].
    """
    gen = torch.Generator().manual_seed(seed)
    cases, depth, vocab = 4, 3, 16
    target_logits = torch.randn(cases, depth + 1, vocab, generator=gen) * 1.5
    draft_logits = target_logits[:, :depth] + torch.randn(cases, depth, vocab, generator=gen)
    q = torch.softmax(draft_logits, dim=-1)
    rows = cases * batch_per_case
    target = target_logits.repeat_interleave(batch_per_case, 0)
    q_rows = q.repeat_interleave(batch_per_case, 0)
    drafts = torch.multinomial(q_rows.reshape(-1, vocab), 1, generator=gen).view(rows, depth)
    # Every 4th row is a point mass (n-gram/random draft): its token is uniform, q ignored.
    point_mass = torch.arange(rows) % 4 == 3
    uniform = torch.randint(0, vocab, (rows, depth), generator=gen)
    drafts = torch.where(point_mass.unsqueeze(1), uniform, drafts)
    return target, drafts, q_rows, point_mass, torch.softmax(target_logits, -1), q


def _verify_sampled(
    target: torch.Tensor,
    drafts: torch.Tensor,
    q_rows: torch.Tensor,
    point_mass: torch.Tensor,
    device: torch.device,
    seed: int,
) -> VerifyResult:
    """`verify` at temperature 1 on `device`, with a generator seeded there."""
    sampling = SamplingBatch.uniform(target.shape[0], temperature=1.0).to(device)
    return verify(
        target.to(device),
        drafts.to(device),
        q_rows.to(device),
        sampling,
        point_mass=point_mass.to(device),
        generator=torch.Generator(device=device).manual_seed(seed),
    )


def _check_lossless(
    result: VerifyResult, point_mass: torch.Tensor, p: torch.Tensor, q: torch.Tensor, label: str
) -> float:
    """First emitted token ~ p[case, 0]; P(accept >= 1) = sum min(p, q) (sampled rows).

    Returns the worst deviation of a first-token frequency from p, in standard errors.
    """
    cases, vocab = p.shape[0], p.shape[-1]
    first = result.emitted[:, 0].cpu().view(cases, -1)
    accept = result.accept_len.cpu().view(cases, -1)
    pm = point_mass.view(cases, -1)
    per_case = first.shape[1]
    worst = 0.0
    for c in range(cases):
        freq = torch.bincount(first[c], minlength=vocab).double() / per_case
        target = p[c, 0].double()
        sigma = (target * (1 - target) / per_case).sqrt() + 1e-4
        z = ((freq - target).abs() / sigma).max().item()
        worst = max(worst, z)
        assert z <= SIGMAS, f"{label}: case {c} first token deviates from p by {z:.1f} sigma"
        sampled = accept[c][~pm[c]]
        rate = (sampled >= 1).double().mean().item()
        expected = torch.minimum(p[c, 0], q[c, 0]).sum().item()
        sigma = (expected * (1 - expected) / sampled.numel()) ** 0.5 + 1e-4
        assert abs(rate - expected) / sigma <= SIGMAS, (
            f"{label}: case {c} P(accept>=1) {rate:.4f} vs {expected:.4f}"
        )
    return worst

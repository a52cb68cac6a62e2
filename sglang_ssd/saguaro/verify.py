"""Exact (lossless) verification of one speculative round, batched over requests.

Row rules (docs/design.md#exactness-rules; Leviathan et al. 2023 / Chen et al. 2023 speculative
sampling;
SSD paper section 3: verification is unchanged by pre-speculation):
- sampled draft token x ~ q: accept with prob min(1, p(x) / q(x)); at the first rejection the bonus
  is drawn from norm(max(p - q, 0)).
- point mass (n-gram, random, greedy backup; q = delta_x): accept with prob p(x); on rejection the
  bonus is drawn from p with x removed, renormalised. This is the rule above with q = delta_x.
- greedy request (top_k == 1 or temperature == 0): accept iff x == argmax p; bonus argmax p.
- all D accepted: the bonus is drawn from p at position D + 1.
If a residual is numerically all zero (p == q up to rounding) the bonus is drawn from p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .host_copies import to_device
from .sampling import SamplingBatch, apply_sampling
from .uniforms import VerifyUniforms


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of `verify` for B requests with draft length D.

    Attributes:
        accept_len: int64 [B] in 0..D, accepted draft tokens (bonus excluded).
        bonus_token: int64 [B], the token sampled after the accepted prefix.
        emitted: int64 [B, D + 1], accepted tokens then the bonus token, padded with -1.
    """

    accept_len: torch.Tensor
    bonus_token: torch.Tensor
    emitted: torch.Tensor

    @property
    def num_emitted(self) -> torch.Tensor:
        """int64 [B]: tokens emitted this round (accept length L = accept_len + 1)."""
        return self.accept_len + 1


def verify(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: SamplingBatch,
    point_mass: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    uniforms: VerifyUniforms | None = None,
) -> VerifyResult:
    """Verify D draft tokens per request against the target, exactly.

    Args:
        target_logits: float [B, D + 1, V], the target's logits at the D + 1 verified positions
            (row j scores draft token j; row D scores the all-accepted bonus). Penalties, logit
            bias and grammar masks must already be applied; temperature/top-k/top-p/min-p are
            applied here by `apply_sampling`, as SGLang's sampler does.
        draft_tokens: int64 [B, D], D >= 0 (D = 0: one token is sampled from p), on the
            logits' device or on the CPU (then range-checked there and copied over, so the
            check reads no device memory).
        draft_probs: float [B, D, V], the exact q each draft token was sampled from (Saguaro
            rescaling and the draft's temperature/top-k/top-p included, same dtype; widening to
            float32/64 here is exact), or None: every row is a point mass.
        sampling: the target requests' sampling parameters, batch size B, on any device;
            when it is on the CPU (the target worker keeps it there), which rows are greedy,
            tempered or filtered is read without a device sync.
        point_mass: bool [B] or None; True rows' tokens were not sampled from a known q
            (n-gram, random or greedy backup) and their `draft_probs` rows are ignored.
        generator: torch.Generator on the logits' device, or None for the global RNG. The
            draft's randomness must be independent of this one
            (docs/design.md#independent-randomness).
        uniforms: the acceptance and bonus uniforms (`VerifyUniforms`: accept float [B, D],
            bonus float64 [B]) instead of draws from `generator`, which is then unused; CUDA
            and CPU given the same uniforms emit the same tokens up to rounding ties. None:
            drawn from `generator`, exactly as without this argument.

    Returns:
        VerifyResult on the logits' device.

    Raises:
        ValueError: on inconsistent shapes, dtypes, devices or out-of-range draft tokens.

    Source: docs/design.md#exactness-rules; paper section 3 (SSD keeps SD's verifier).
    """
    batch, depth, _ = _check_inputs(target_logits, draft_tokens, draft_probs, sampling, point_mass)
    if uniforms is not None:
        uniforms.check(batch, depth)
    device = target_logits.device
    draft_tokens = to_device(draft_tokens, device)
    greedy = sampling.is_greedy  # on `sampling`'s device: the host when the caller keeps it there
    if point_mass is None:
        point_mass = torch.full((batch,), draft_probs is None, dtype=torch.bool, device=device)
    elif draft_probs is None:
        point_mass = torch.ones_like(point_mass)

    accept_len = torch.zeros(batch, dtype=torch.int64, device=device)
    bonus = torch.zeros(batch, dtype=torch.int64, device=device)
    num_greedy = int(greedy.sum())
    if num_greedy > 0:
        _, rows = _rows(greedy, num_greedy == batch, device)
        accept_len[rows], bonus[rows] = _verify_greedy(target_logits[rows], draft_tokens[rows])
    if num_greedy < batch:
        here, rows = _rows(~greedy, num_greedy == 0, device)
        accept_len[rows], bonus[rows] = _verify_sampled(
            target_logits[rows],
            draft_tokens[rows],
            None if draft_probs is None else draft_probs[rows],
            sampling.select(here),
            point_mass[rows],
            generator,
            None if uniforms is None else uniforms.select(here),
        )

    emitted = torch.full((batch, depth + 1), -1, dtype=torch.int64, device=device)
    if depth > 0:
        positions = torch.arange(depth, device=device).unsqueeze(0)
        emitted[:, :depth] = torch.where(positions < accept_len.unsqueeze(1), draft_tokens, -1)
    emitted.scatter_(1, accept_len.unsqueeze(1), bonus.unsqueeze(1))
    return VerifyResult(accept_len=accept_len, bonus_token=bonus, emitted=emitted)


def _rows(
    mask: torch.Tensor, every_row: bool, device: torch.device
) -> tuple[slice | torch.Tensor, slice | torch.Tensor]:
    """Index selecting `mask`'s rows on `mask`'s device and on `device`; a slice (no copy)
    when that is every row."""
    if every_row:
        return slice(None), slice(None)
    here = mask.nonzero().squeeze(1)
    return here, to_device(here, device)


def _verify_greedy(
    logits: torch.Tensor, draft_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy rows: accept while x == argmax p; the bonus is argmax p after the prefix."""
    depth = draft_tokens.shape[1]
    argmax = logits.argmax(dim=2)  # [N, D + 1]; argmax p == argmax logits for greedy p
    accepted = draft_tokens == argmax[:, :depth]
    accept_len = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    return accept_len, argmax.gather(1, accept_len.unsqueeze(1)).squeeze(1)


def _verify_sampled(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: SamplingBatch,
    point_mass: torch.Tensor,
    generator: torch.Generator | None,
    uniforms: VerifyUniforms | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-greedy rows: ratio acceptance, then the bonus from the residual (or p at D + 1);
    the uniforms come from `uniforms` when given, else from `generator`."""
    batch, depth = draft_tokens.shape
    device = logits.device
    p = apply_sampling(logits, sampling)  # [N, D + 1, V], float32/64
    accept_len = torch.zeros(batch, dtype=torch.int64, device=device)
    if depth > 0:
        p_x = p[:, :depth].gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # [N, D]
        q_x = torch.ones_like(p_x)
        if draft_probs is not None:
            sampled_q_x = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2)
            q_x = torch.where(point_mass.unsqueeze(1), q_x, sampled_q_x.to(p.dtype))
        if uniforms is None:
            u = torch.rand(p_x.shape, generator=generator, device=device, dtype=p.dtype)
        else:
            u = uniforms.accept.to(device=device, dtype=p.dtype)
        # u * q < p  <=>  u < p / q: accept with prob min(1, p(x) / q(x)), no division by q.
        accepted = u * q_x < p_x
        accept_len = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)

    arange_n = torch.arange(batch, device=device)
    p_at = p[arange_n, accept_len]  # [N, V]: p at the first rejection, or at D + 1
    residual = p_at
    # Every row's case is applied with a mask (`where`), not by gathering its rows: the same
    # values, and no device-to-host read of which rows they are.
    if depth > 0:
        rejected = accept_len < depth
        row = accept_len.clamp(max=depth - 1)
        if draft_probs is not None:
            q_row = draft_probs[arange_n, row].to(p.dtype)
            sampled = (rejected & ~point_mass).unsqueeze(1)
            residual = torch.where(sampled, (p_at - q_row).clamp_(min=0.0), p_at)
        # Point-mass rejection: max(p - delta_x, 0) is p with x removed.
        dropped = (rejected & point_mass).unsqueeze(1)
        x = draft_tokens.gather(1, row.unsqueeze(1))  # [N, 1]
        kept = torch.where(dropped, 0.0, residual.gather(1, x))
        residual = residual.clone() if residual is p_at else residual
        residual.scatter_(1, x, kept)
        empty = (residual.sum(dim=1) <= 0).unsqueeze(1)
        residual = torch.where(empty, p_at, residual)
    bonus_u = None if uniforms is None else uniforms.bonus.to(device=device).unsqueeze(1)
    return accept_len, _sample_rows(residual, generator, bonus_u)


def _sample_rows(
    weights: torch.Tensor, generator: torch.Generator | None, u: torch.Tensor | None = None
) -> torch.Tensor:
    """One index per row of non-negative weights [N, V] (unnormalised), by inverse CDF.

    `u`: float64 [N, 1] uniforms in [0, 1), or None to draw them from `generator`.

    Two levels, both accumulated in float64 (a float32 cumsum over V = 151,936 drifts by ~1e-5):
    block sums pick a block of min(`_BLOCK`, V) tokens, a cumsum inside it picks the token.
    This reads the weights once, with no float64 copy of them; also much faster than
    torch.multinomial on CPU. Zero-weight tokens are never returned.
    """
    rows, vocab = weights.shape
    size = min(_BLOCK, vocab)
    weights = weights.contiguous()
    full = vocab // size * size
    sums = [weights[:, :full].view(rows, -1, size).sum(dim=2, dtype=torch.float64)]
    if full < vocab:
        sums.append(weights[:, full:].sum(dim=1, keepdim=True, dtype=torch.float64))
    cdf = torch.cat(sums, dim=1).cumsum(dim=1)  # [N, blocks]
    total = cdf[:, -1:].contiguous()
    if u is None:
        u = torch.rand(total.shape, generator=generator, device=weights.device, dtype=torch.float64)
    target = u * total
    last = torch.searchsorted(cdf, total, right=False)  # the last block with positive weight
    block = torch.minimum(torch.searchsorted(cdf, target, right=True), last)  # [N, 1]
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    index = block * size + torch.arange(size, device=weights.device)
    inside = weights.gather(1, index.clamp(max=vocab - 1)).to(torch.float64)
    inside = torch.where(index < vocab, inside, 0.0).cumsum(dim=1)  # [N, size]
    pick = torch.searchsorted(inside, (target - before).clamp(min=0.0), right=True)
    last_inside = torch.searchsorted(inside, inside[:, -1:].contiguous(), right=False)
    return (block * size + torch.minimum(pick, last_inside)).squeeze(1)


_BLOCK = 1024


def _check_inputs(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: SamplingBatch,
    point_mass: torch.Tensor | None,
) -> tuple[int, int, int]:
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 3:
        raise ValueError("target_logits must be a tensor [B, D + 1, V]")
    if not target_logits.dtype.is_floating_point:
        raise ValueError(f"target_logits must be floating point, got {target_logits.dtype}")
    batch, positions, vocab = target_logits.shape
    depth = positions - 1
    if positions < 1 or vocab < 1:
        raise ValueError(
            f"target_logits must have D + 1 >= 1 positions and V >= 1, got "
            f"{tuple(target_logits.shape)}"
        )
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype != torch.int64:
        raise ValueError("draft_tokens must be an int64 tensor [B, D]")
    if tuple(draft_tokens.shape) != (batch, depth):
        raise ValueError(
            f"draft_tokens shape {tuple(draft_tokens.shape)} != (B, D) = "
            f"{(batch, depth)} implied by target_logits {tuple(target_logits.shape)}"
        )
    if draft_tokens.device not in (target_logits.device, torch.device("cpu")):
        raise ValueError("draft_tokens must be on target_logits' device or on the CPU")
    if draft_tokens.numel() > 0 and bool(((draft_tokens < 0) | (draft_tokens >= vocab)).any()):
        raise ValueError(f"draft_tokens must lie in [0, V) = [0, {vocab})")
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) or not draft_probs.dtype.is_floating_point:
            raise ValueError("draft_probs must be a float tensor [B, D, V] or None")
        if tuple(draft_probs.shape) != (batch, depth, vocab):
            raise ValueError(
                f"draft_probs shape {tuple(draft_probs.shape)} != (B, D, V) = "
                f"{(batch, depth, vocab)}"
            )
        if draft_probs.device != target_logits.device:
            raise ValueError("draft_probs and target_logits are on different devices")
    if point_mass is not None:
        if not isinstance(point_mass, torch.Tensor) or point_mass.dtype != torch.bool:
            raise ValueError("point_mass must be a bool tensor [B] or None")
        if tuple(point_mass.shape) != (batch,):
            raise ValueError(f"point_mass shape {tuple(point_mass.shape)} != (B,) = {(batch,)}")
        if point_mass.device != target_logits.device:
            raise ValueError("point_mass and target_logits are on different devices")
    if not isinstance(sampling, SamplingBatch) or sampling.batch_size != batch:
        raise ValueError(f"sampling must be a SamplingBatch of batch size B = {batch}")
    return batch, depth, vocab

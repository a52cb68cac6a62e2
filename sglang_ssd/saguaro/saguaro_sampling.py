"""Saguaro sampling (paper Definition 14): down-weight the draft's top-M tokens by beta.

sigma(z)_t is proportional to beta * exp(z_t) for t among the top M tokens and exp(z_t) otherwise,
applied after temperature/top-k/top-p. With M_j = F_j + 1 for draft token d_{j+1}: if d_{j+1} is
rejected (k = j) the bonus comes from the residual max(p - sigma, 0), which this pushes onto the
top tokens the fork caches (the top F_j + 1 minus d_{j+1}). The same sigma is the q that `verify`
must receive (DESIGN.md section 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .sampling import SamplingBatch, apply_sampling


def saguaro_probs(
    draft_logits: torch.Tensor,
    top_m: int | Sequence[int] | torch.Tensor,
    beta: float,
    sampling: SamplingBatch,
) -> torch.Tensor:
    """The Saguaro draft distribution sigma for every row of `draft_logits`.

    Args:
        draft_logits: float [B, V] or [B, D, V] (any [B, ..., V]); row b uses request b's
            sampling parameters.
        top_m: M, how many of the most probable tokens (after temperature/top-k/top-p) are scaled
            by beta: an int, or ints broadcast right-aligned against `draft_logits.shape[:-1]`:
            [B] per request for [B, V] input; [D] per depth, [B, 1] per request or [B, D] for
            [B, D, V] input. M = 0 leaves a row unchanged; M >= V scales every token, which
            renormalises back to p. Use `top_m_from_fanout` for M_j = F_j + 1.
        beta: float in (0, 1]. beta == 1 returns `apply_sampling(draft_logits, sampling)` exactly.
        sampling: the draft's sampling parameters (those of the requests), batch size B.

    Returns:
        probs: float32 [B, ..., V] (float64 for float64 logits), rows sum to 1. Greedy rows are
        returned as `apply_sampling` gives them, i.e. one-hot at argmax(logits), unscaled:
        Saguaro sampling never applies to greedy requests. Tokens filtered out by top-k/top-p
        have probability 0 and stay 0. Ties at the M-th rank are broken by `torch.topk`;
        whichever tokens it picks, the returned tensor is the distribution to sample from and to
        pass to `verify` as q.

    Raises:
        ValueError: if beta is outside (0, 1], top_m is negative or does not broadcast.

    Source: paper Definition 14; DESIGN.md section 1 ("Saguaro sampling").
    """
    beta = float(beta)
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta must be in (0, 1], got {beta}")
    probs = apply_sampling(draft_logits, sampling)
    if beta == 1.0:
        return probs
    vocab = probs.shape[-1]
    lead_shape = probs.shape[:-1]
    m = torch.as_tensor(top_m, dtype=torch.int64, device=probs.device)
    if m.dim() > len(lead_shape):
        raise ValueError(f"top_m shape {tuple(m.shape)} has more dims than {tuple(lead_shape)}")
    if m.numel() > 0 and bool((m < 0).any()):
        raise ValueError("top_m must be >= 0")
    try:
        m = torch.broadcast_to(m, lead_shape)
    except RuntimeError as err:
        raise ValueError(
            f"top_m shape {tuple(m.shape)} does not broadcast to {tuple(lead_shape)}"
        ) from err
    m = m.clamp(max=vocab)
    max_m = int(m.max()) if m.numel() > 0 else 0
    if max_m == 0:
        return probs
    top_idx = torch.topk(probs, k=max_m, dim=-1, sorted=True).indices  # [..., max_m]
    rank = torch.arange(max_m, device=probs.device)
    in_top = rank < m.unsqueeze(-1)
    scale = torch.where(in_top, beta, 1.0).to(probs.dtype)
    factor = torch.ones_like(probs).scatter_(-1, top_idx, scale)
    scaled = probs * factor
    scaled = scaled / scaled.sum(dim=-1, keepdim=True)
    greedy = sampling.to(probs.device).is_greedy.view(-1, *([1] * (probs.dim() - 1)))
    return torch.where(greedy, probs, scaled)


def top_m_from_fanout(fanout: Sequence[int]) -> list[int]:
    """M_j = F_j + 1 for draft tokens d_{j+1}, j = 0..gamma-1 (DESIGN.md section 1).

    Args:
        fanout: F_0..F_gamma (length gamma + 1), e.g. from `geometric_fanout`.

    Returns:
        [F_0 + 1, ..., F_{gamma-1} + 1], length gamma: F_gamma (all accepted, bonus from p) has no
        Saguaro counterpart.

    Raises:
        ValueError: if `fanout` is empty or has a negative entry.
    """
    fanout = [int(f) for f in fanout]
    if not fanout or min(fanout) < 0:
        raise ValueError(f"fanout must be a non-empty list of ints >= 0, got {fanout}")
    return [f + 1 for f in fanout[:-1]]

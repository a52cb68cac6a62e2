"""Verify a padded batch of drafts with `sglang_ssd.saguaro.verify` and lay out the result the
way SGLang's spec-v2 scheduler consumes it.

The target forward always covers W = γ + 1 positions per request ([root, d_1 .. d_γ], padded);
rows with fewer draft tokens are verified over their own D_r only, in groups of equal D_r (one
`verify` call per group, vectorised inside).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sglang_ssd.saguaro import SamplingBatch, verify
from sglang_ssd.worker.draft_batch import DraftBatch


@dataclass
class VerifiedBatch:
    """Verification outcome in SGLang's chain layout (stride W = γ + 1).

    Attributes:
        accept_len: int64 [B], k (bonus excluded).
        bonus: int64 [B], t*.
        predict: int64 [B * W], row b's emitted tokens at b*W .. b*W + k, zeros elsewhere.
        accept_index: int64 [B, W], b*W + j for j ≤ k, else -1 (SGLang's accept_index).
    """

    accept_len: torch.Tensor
    bonus: torch.Tensor
    predict: torch.Tensor
    accept_index: torch.Tensor

    @property
    def accept_lens_with_bonus(self) -> torch.Tensor:
        """int32 [B], k + 1: SGLang's accept_lens (tokens committed this round)."""
        return (self.accept_len + 1).to(torch.int32)


def verify_tokens(roots: Sequence[int], drafts: DraftBatch, width: int) -> torch.Tensor:
    """The verify forward's input tokens: [root, d_1 .. d_Dmax] per row, zero-padded.

    Args:
        roots: per request, its last committed token (batch order).
        drafts: the round's drafts, Dmax ≤ W - 1 (their -1 padding becomes 0).
        width: W = γ + 1.

    Returns:
        int64 [B, W] on the CPU.
    """
    tokens = torch.zeros(len(roots), width, dtype=torch.int64)
    tokens[:, 0] = torch.tensor(roots, dtype=torch.int64)
    depth_max = drafts.tokens.shape[1]
    tokens[:, 1 : 1 + depth_max] = drafts.tokens.clamp(min=0)
    return tokens


def verify_batch(
    logits: torch.Tensor,
    drafts: DraftBatch,
    sampling: SamplingBatch,
    width: int,
    generator: torch.Generator | None = None,
) -> VerifiedBatch:
    """Run `saguaro.verify` on every row of a verify forward.

    Args:
        logits: float [B * W, V], the target's logits over [root, d_1 .. d_{W-1}] per row.
        drafts: the round's drafts, Dmax ≤ W - 1.
        sampling: the target requests' sampling parameters (p's temperature/top-k/top-p).
        width: W = γ + 1.
        generator: the target's RNG for acceptance and bonus sampling.

    Raises:
        ValueError: on inconsistent shapes.
    """
    b = drafts.batch_size
    vocab = logits.shape[-1]
    if logits.shape[0] != b * width or drafts.tokens.shape[1] > width - 1:
        raise ValueError(
            f"logits [{logits.shape[0]}, V] / drafts {tuple(drafts.tokens.shape)} "
            f"do not fit W={width}"
        )
    logits = logits.view(b, width, vocab)
    accept_len = torch.zeros(b, dtype=torch.int64)
    bonus = torch.zeros(b, dtype=torch.int64)
    depth = drafts.depth.cpu()
    for d in torch.unique(depth).tolist():
        rows = (depth == d).nonzero().squeeze(1)
        q = None
        if drafts.q is not None and bool(drafts.has_q[rows].any()):
            q = drafts.q[rows, :d].to(logits.device)
        result = verify(
            logits[rows.to(logits.device), : d + 1],
            drafts.tokens[rows, :d].to(logits.device),
            q,
            sampling.select(rows),
            point_mass=(~drafts.has_q[rows]).to(logits.device),
            generator=generator,
        )
        accept_len[rows] = result.accept_len.cpu()
        bonus[rows] = result.bonus_token.cpu()
    return chain_layout(drafts.tokens, accept_len, bonus, width)


def chain_layout(
    draft_tokens: torch.Tensor, accept_len: torch.Tensor, bonus: torch.Tensor, width: int
) -> VerifiedBatch:
    """Lay out a verified round (k, t* per row) the way SGLang's spec-v2 scheduler commits it.

    A pure function of the drafts and the outcome, so every TP rank that holds both builds the
    same `VerifiedBatch` (`tp_sync.share_outcome`).

    Args:
        draft_tokens: int64 [B, Dmax] (CPU), the round's drafts, -1 padded, Dmax ≤ W - 1.
        accept_len: int64 [B] (CPU), k ≤ D_r.
        bonus: int64 [B] (CPU), t*.
        width: W = γ + 1.
    """
    b = draft_tokens.shape[0]
    cols = torch.arange(width).unsqueeze(0)
    padded = torch.zeros(b, width, dtype=torch.int64)
    padded[:, : draft_tokens.shape[1]] = draft_tokens.clamp(min=0)
    predict = torch.where(cols < accept_len.unsqueeze(1), padded, 0)
    predict.scatter_(1, accept_len.unsqueeze(1), bonus.unsqueeze(1))
    base = torch.arange(b).unsqueeze(1) * width
    accept_index = torch.where(cols <= accept_len.unsqueeze(1), base + cols, -1)
    return VerifiedBatch(
        accept_len=accept_len,
        bonus=bonus,
        predict=predict.reshape(-1),
        accept_index=accept_index,
    )

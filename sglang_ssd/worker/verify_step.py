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
from sglang_ssd.saguaro.host_copies import to_device
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
        sampling: the target requests' sampling parameters (p's temperature/top-k/top-p), on
            the CPU as `ssd_worker._sampling_of` builds them (read there without a device sync).
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
    device = logits.device
    # Rows by draft depth, read from the host-side DraftBatch (ascending depth, rows in order).
    groups: dict[int, list[int]] = {}
    for row, d in enumerate(drafts.depth.tolist()):
        groups.setdefault(d, []).append(row)
    has_q = drafts.has_q.tolist()
    accept_len = torch.zeros(b, dtype=torch.int64, device=device)
    bonus = torch.zeros(b, dtype=torch.int64, device=device)
    for d in sorted(groups):
        rows = torch.tensor(groups[d], dtype=torch.int64)
        rows_there = to_device(rows, device)
        q = None
        if drafts.q is not None and any(has_q[r] for r in groups[d]):
            q = drafts.q[rows_there, :d]
        result = verify(
            logits[rows_there, : d + 1],
            drafts.tokens[rows, :d],  # on the host: `verify` checks them there
            q,
            sampling.select(rows),
            point_mass=to_device(~drafts.has_q[rows], device),
            generator=generator,
        )
        accept_len[rows_there] = result.accept_len
        bonus[rows_there] = result.bonus_token
    # The round's one device-to-host copy of its outcome.
    outcome = torch.stack([accept_len, bonus]).cpu()
    accept_len, bonus = outcome[0], outcome[1]
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

"""Drafts for one decode batch, as the target receives them.

Rows may have different draft lengths D_r ≤ γ (a cache hit carries the tree depth D, a backup
carries γ); `tokens` is padded with -1. Only rows with `has_q` carry q; greedy and point-mass
rows do not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftBatch:
    """Drafts of B requests for one round.

    Attributes:
        tokens: int64 [B, Dmax], padded with -1.
        depth: int64 [B], D_r, the number of valid tokens per row.
        q: float32 [B, Dmax, V] or None; rows without `has_q` are zeros.
        has_q: bool [B]; False rows are point masses (n-gram, random) or greedy.
        sources: per row "cache", "jit", "ngram", "random", "local-ngram" or "plain" (a plain
            round: no draft).
    """

    tokens: torch.Tensor
    depth: torch.Tensor
    q: torch.Tensor | None
    has_q: torch.Tensor
    sources: list[str]

    @classmethod
    def plain(cls, batch_size: int) -> DraftBatch:
        """A plain round's drafts: no token for any of `batch_size` rows (source "plain")."""
        return cls(
            tokens=torch.empty(batch_size, 0, dtype=torch.int64),
            depth=torch.zeros(batch_size, dtype=torch.int64),
            q=None,
            has_q=torch.zeros(batch_size, dtype=torch.bool),
            sources=["plain"] * batch_size,
        )

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    def __post_init__(self) -> None:
        b = self.tokens.shape[0]
        if self.depth.shape != (b,) or self.has_q.shape != (b,) or len(self.sources) != b:
            raise ValueError("DraftBatch fields disagree on the batch size")
        if self.q is not None and self.q.shape[:2] != self.tokens.shape:
            raise ValueError(f"q {tuple(self.q.shape)} does not match tokens {self.tokens.shape}")

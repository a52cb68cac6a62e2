"""Drafts for one decode batch, as the target receives them.

Rows may have different draft lengths D_r ≤ γ (a cache hit carries the tree depth D, a backup
carries γ); `tokens` is padded with -1. Only rows with `has_q` carry q; greedy and point-mass
rows do not. `dense_q` lays the speculator's q rows out for the target: on the target's device,
at the target's vocabulary width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftBatch:
    """Drafts of B requests for one round.

    Attributes:
        tokens: int64 [B, Dmax], padded with -1 (on the CPU).
        depth: int64 [B], D_r, the number of valid tokens per row (on the CPU).
        q: float32 [B, Dmax, V] or None, V the target's vocabulary, on the device the target
            verifies on; rows without `has_q` are zeros.
        has_q: bool [B] (on the CPU); False rows are point masses (n-gram, random) or greedy.
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


def dense_q(
    q: torch.Tensor,
    has_q: torch.Tensor,
    vocab_size: int,
    device: torch.device | str,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """The q of every row of a batch, as the target's verify takes it.

    The speculator sends q only for the rows that carry one, and only at the columns of its
    draft vocabulary (`columns`, from its `Hello`; q is zero at every other id, so the
    scatter is exact), or at the draft's whole vocabulary width when `columns` is None. A
    narrower draft (e.g. Qwen2.5-0.5B's 151,936 ids for a 7B target's 152,064) is padded
    with zeros: the draft never drafts those ids. A wider draft never drafts the ids beyond
    the target's (`speculator.draft_vocab.limit` gives them logit -inf before sampling), so
    the columns cut hold no mass; any that do are refused, since verification with them cut
    would not be exact.

    Args:
        q: float [n_q, Dmax, W], on any device; W = columns.numel(), or V_draft.
        has_q: bool [B] with n_q True rows (any device).
        vocab_size: V, the target's logit width.
        device: where the target verifies (the returned tensor's device).
        columns: int64 [W], ascending distinct ids: column j of q is id columns[j]
            (any device); None: column j is id j.

    Returns:
        q.dtype [B, Dmax, V] on `device`; rows without `has_q` are zeros.

    Raises:
        ValueError: when `has_q` does not count q's rows, `columns` does not count q's
            columns, or q has mass on ids >= V.
    """
    n_q, depth, width = q.shape
    carried = int(has_q.sum())
    if carried != n_q:
        raise ValueError(f"q has {n_q} rows but {carried} drafts carry one")
    device = torch.device(device)
    if columns is None:
        columns = torch.arange(width)
    elif columns.shape != (width,):
        raise ValueError(f"q has {width} columns but {columns.numel()} column ids came")
    columns = columns.cpu().to(torch.int64)  # checked on the host: no device sync for it
    inside = columns < vocab_size
    if not bool(inside.all()):
        if bool((q[:, :, inside.logical_not().to(q.device)] != 0).any()):
            raise ValueError(
                f"the draft's q has mass on ids >= the target's vocabulary ({vocab_size})"
            )
        q, columns = q[:, :, inside.to(q.device)], columns[inside]
    # One [B, Dmax, V] tensor: q's rows, depths and columns put straight into it.
    rows = has_q.cpu().nonzero().squeeze(1)
    out = torch.zeros(has_q.shape[0], depth, vocab_size, dtype=q.dtype, device=device)
    index = (
        rows.to(device)[:, None, None],
        torch.arange(depth, device=device)[:, None],
        columns.to(device),
    )
    out.index_put_(index, q.to(device))
    return out

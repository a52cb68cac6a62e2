"""The speculator's `Drafts` reply as the target's `DraftBatch`.

Over NCCL the tensors arrive on the target's GPU; tokens are small bookkeeping (CPU), q goes
where the target verifies (`dense_q`). Rows the speculator could not draft (source "missing")
are served by the target's own n-gram drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sglang_ssd.saguaro import draft_kinds
from sglang_ssd.transport import DraftSource, ReceivedDrafts, TransportError
from sglang_ssd.worker.draft_batch import DraftBatch, dense_q
from sglang_ssd.worker.draft_provider import DraftSupplier


def reply_batch(
    reqs: Sequence[Any],
    got: ReceivedDrafts,
    vocab_size: int,
    target_device: torch.device,
    local: DraftSupplier,
) -> tuple[DraftBatch, list[int]]:
    """The drafts of `reqs` (batch order, one `Drafts` entry each) from the reply `got`.

    Args:
        reqs: the Step's requests (SGLang `Req`s).
        got: the reply: its message, tokens int64 [B, Dmax], q [B', Dmax, W] or None and
            the ids of q's W columns (None: every id).
        vocab_size: V, the target's logit width.
        target_device: where the target verifies (q goes there, tokens to the CPU).
        local: drafts for the rows the speculator had none for.

    Returns:
        The `DraftBatch` and the rows drafted by `local` (the speculator no longer holds
        those requests).

    Raises:
        TransportError: drafts the target cannot use (a q wider than V or deeper than the
            tokens, a token outside V, a device surprise): the speculator's fault, not the
            scheduler's, so that it is restarted and this round served by `local` drafts.
    """
    msg, tokens, q, columns = got
    depth = torch.tensor([e.depth for e in msg.entries], dtype=torch.int64)
    has_q = torch.tensor([e.has_q for e in msg.entries], dtype=torch.bool)
    sources = [e.source for e in msg.entries]
    try:
        tokens = tokens.cpu()
        dense = None if q is None else dense_q(q, has_q, vocab_size, target_device, columns)
        if dense is not None and dense.shape[1] != tokens.shape[1]:
            raise ValueError(f"q depth {dense.shape[1]} != draft depth {tokens.shape[1]}")
        if tokens.numel() and int(tokens.max()) >= vocab_size:
            raise ValueError(f"a draft token is outside the target's {vocab_size} ids")
    except (RuntimeError, ValueError) as exc:
        raise TransportError(f"unusable drafts from the speculator: {exc}") from exc
    missing = [i for i, e in enumerate(msg.entries) if e.source == DraftSource.MISSING]
    if missing:
        filled = local.drafts([reqs[i] for i in missing])
        width = max(tokens.shape[1], filled.tokens.shape[1])
        tokens = torch.nn.functional.pad(tokens, (0, width - tokens.shape[1]), value=-1)
        if dense is not None:
            dense = torch.nn.functional.pad(dense, (0, 0, 0, width - dense.shape[1]))
        for j, i in enumerate(missing):
            tokens[i] = -1
            tokens[i, : filled.tokens.shape[1]] = filled.tokens[j]
            depth[i] = filled.depth[j]
            sources[i] = draft_kinds.LOCAL_NGRAM
    batch = DraftBatch(tokens=tokens, depth=depth, q=dense, has_q=has_q, sources=sources)
    return batch, missing

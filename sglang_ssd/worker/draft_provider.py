"""Where the target's drafts come from: the `DraftSupplier` protocol and the target's own n-gram
drafts (`LocalNgramProvider`), used while the speculator is unavailable.

The speculator process's drafts come through `speculator_client.SpeculatorClient`, which falls
back to `LocalNgramProvider` and adds the request lifecycle (prepare, outcomes, close, reset,
shutdown).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from sglang_ssd.saguaro import NgramSpeculator
from sglang_ssd.saguaro.draft_kinds import LOCAL_NGRAM
from sglang_ssd.worker.draft_batch import DraftBatch


def request_tokens(req: Any) -> list[int]:
    """All committed tokens of an SGLang `Req`: prompt, then generated output."""
    return list(req.origin_input_ids) + list(req.output_ids)


class DraftSupplier(Protocol):
    def drafts(self, reqs: Sequence[Any]) -> DraftBatch:
        """Drafts for `reqs` (SGLang `Req`s, batch order)."""
        ...


class LocalNgramProvider:
    """Point-mass n-gram drafts from each request's own tokens, computed on the target.

    Used while the speculator is unavailable (docs/design.md#when-the-speculator-is-down: the target
    keeps serving with its
    own `NgramSpeculator`); exact because n-gram tokens do not depend on the target's RNG.
    """

    def __init__(self, lookahead: int) -> None:
        self.lookahead = lookahead
        self.ngram = NgramSpeculator()

    def drafts(self, reqs: Sequence[Any]) -> DraftBatch:
        """γ point-mass draft tokens per request (`sources` "local-ngram")."""
        return ngram_drafts(self.ngram, [request_tokens(r) for r in reqs], self.lookahead)


def ngram_drafts(
    ngram: NgramSpeculator, sequences: Sequence[Sequence[int]], depth: int
) -> DraftBatch:
    """Point-mass drafts from each request's own tokens (the target's fallback while the
    speculator is down; docs/design.md#when-the-speculator-is-down)."""
    tokens = ngram.propose_batch(sequences, depth).to(torch.int64)
    b = len(sequences)
    return DraftBatch(
        tokens=tokens,
        depth=torch.full((b,), depth, dtype=torch.int64),
        q=None,
        has_q=torch.zeros(b, dtype=torch.bool),
        sources=[LOCAL_NGRAM] * b,
    )

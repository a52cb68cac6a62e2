"""Where the target gets its drafts: the speculator process, or its own n-gram drafts.

`DraftProvider` is what `SSDWorker` talks to each round: `drafts(reqs)` for the batch about to
be verified (carrying the previous round's outcomes to the speculator) and `record_outcomes`
after verification.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import NgramSpeculator
from sglang_ssd.worker.draft_batch import DraftBatch, ngram_drafts

logger = logging.getLogger(__name__)


def request_tokens(req: Any) -> list[int]:
    """All committed tokens of an SGLang `Req`: prompt, then generated output."""
    return list(req.origin_input_ids) + list(req.output_ids)


class DraftProvider(Protocol):
    def prepare(self, reqs: Sequence[Any]) -> None:
        """`reqs` are about to be prefilled (lets the speculator prefill in parallel)."""
        ...

    def drafts(self, reqs: Sequence[Any]) -> DraftBatch:
        """Drafts for `reqs` (SGLang `Req`s, batch order)."""
        ...

    def record_outcomes(
        self,
        rids: Sequence[str],
        accept_lens: list[int],
        bonus: list[int],
        verify_s: float | None = None,
    ) -> None:
        """The verified outcome (k, t*) of each request this round; `verify_s` is the
        target's verify forward time (feeds the fallback policy)."""
        ...

    def close(self, rid: str) -> None:
        """The request finished or was aborted."""
        ...

    def reset(self) -> None:
        """Forget all requests (SGLang flushed its caches)."""
        ...

    def shutdown(self) -> None:
        """Stop any helper process."""
        ...


class LocalNgramProvider:
    """Point-mass n-gram drafts from each request's own tokens, computed on the target.

    Used while the speculator is unavailable (DESIGN.md §1: the target keeps serving with its
    own `NgramSpeculator`); exact because n-gram tokens do not depend on the target's RNG.
    """

    def __init__(self, lookahead: int) -> None:
        self.lookahead = lookahead
        self.ngram = NgramSpeculator()

    def prepare(self, reqs: Sequence[Any]) -> None:
        pass

    def drafts(self, reqs: Sequence[Any]) -> DraftBatch:
        return ngram_drafts(self.ngram, [request_tokens(r) for r in reqs], self.lookahead)

    def record_outcomes(
        self,
        rids: Sequence[str],
        accept_lens: list[int],
        bonus: list[int],
        verify_s: float | None = None,
    ) -> None:
        pass

    def close(self, rid: str) -> None:
        pass

    def reset(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def make_provider(
    config: SSDConfig, draft_model_path: str, target_device: str, vocab_size: int
) -> DraftProvider:
    """The speculator client for `config` (it falls back to local n-gram drafts by itself)."""
    from sglang_ssd.worker.speculator_client import SpeculatorClient

    return SpeculatorClient(
        config,
        draft_model_path=draft_model_path,
        target_device=target_device,
        vocab_size=vocab_size,
    )

"""Fast backup speculators for cache misses (paper Theorem 17; docs/design.md#fallback-theorem-17).

Both propose point-mass drafts: their tokens are not sampled from a known q, so `verify` must be
called with `point_mass=True` for those rows (accept with prob p(x),
docs/design.md#point-mass-drafts). Neither
looks at the target's randomness, which is what keeps the point-mass rule exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

TokenSeq = Sequence[int] | torch.Tensor


class NgramSpeculator:
    """Copy the continuation of the longest, most recent earlier match of the current suffix.

    For n = max_ngram down to min_ngram, the last n tokens are searched for in the request's own
    prompt + output (excluding the suffix itself); the first n with a match wins and its most
    recent occurrence is copied forward, token by token, so the copy may run into the tokens it
    has just proposed (periodic text continues its period). With no match at any n, the
    deterministic fill repeats the last token (token 0 for an empty sequence).

    Source: docs/design.md#fallback-theorem-17; the prompt-lookup / n-gram drafting that SGLang's
    NGRAM algorithm also uses, here over one request's own tokens.
    """

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        """Raises ValueError unless 1 <= min_ngram <= max_ngram."""
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = int(max_ngram)
        self.min_ngram = int(min_ngram)

    def propose(self, tokens: TokenSeq, num_tokens: int) -> torch.Tensor:
        """Draft `num_tokens` tokens after `tokens`.

        Args:
            tokens: the request's prompt + output so far, list[int] or int 1-D tensor [L].
            num_tokens: draft length D >= 0.

        Returns:
            int64 [num_tokens] on the tokens' device (CPU for a list); a point-mass draft.

        Raises:
            ValueError: if `tokens` is not 1-D or num_tokens < 0.
        """
        seq = _as_tensor(tokens)
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        length = seq.shape[0]
        if num_tokens == 0:
            return seq.new_empty(0)
        if length == 0:
            return seq.new_zeros(num_tokens)
        start = self._match_continuation(seq)
        if start is None:
            return seq[-1].repeat(num_tokens)
        # Copy forward from `start`; position start + j may be one we just proposed.
        period = length - start
        offsets = torch.arange(num_tokens, device=seq.device) % period
        return seq[start + offsets]

    def propose_batch(self, batch: Sequence[TokenSeq], num_tokens: int) -> torch.Tensor:
        """`propose` for each request: int64 [B, num_tokens]."""
        if not batch:
            return torch.empty(0, num_tokens, dtype=torch.int64)
        return torch.stack([self.propose(tokens, num_tokens) for tokens in batch])

    def _match_continuation(self, seq: torch.Tensor) -> int | None:
        """Index right after the most recent earlier match of the longest matching suffix."""
        length = seq.shape[0]
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            windows = seq.unfold(0, n, 1)[:-1]  # every n-gram but the suffix itself
            hits = (windows == seq[-n:]).all(dim=1).nonzero()
            if hits.numel() > 0:
                return int(hits[-1, 0]) + n
        return None


class RandomSpeculator:
    """Uniform random tokens in [0, vocab_size): the cheapest backup (paper Theorem 17)."""

    def __init__(self, vocab_size: int, generator: torch.Generator | None = None) -> None:
        """Raises ValueError if vocab_size < 1. `generator` decides the device of proposals."""
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = int(vocab_size)
        self.generator = generator

    def propose(self, tokens: TokenSeq | None, num_tokens: int) -> torch.Tensor:
        """int64 [num_tokens] uniform tokens; `tokens` is ignored (same interface as n-gram)."""
        return self.propose_batch([tokens], num_tokens)[0]

    def propose_batch(self, batch: Sequence[TokenSeq | None], num_tokens: int) -> torch.Tensor:
        """int64 [B, num_tokens] uniform tokens, B = len(batch). Raises ValueError if < 0."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        device = self.generator.device if self.generator is not None else "cpu"
        return torch.randint(
            self.vocab_size,
            (len(batch), num_tokens),
            generator=self.generator,
            device=device,
            dtype=torch.int64,
        )


def _as_tensor(tokens: TokenSeq) -> torch.Tensor:
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
        return tokens.to(torch.int64)
    return torch.tensor(list(tokens), dtype=torch.int64)

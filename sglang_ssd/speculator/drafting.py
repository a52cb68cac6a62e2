"""Turn draft logits into draft tokens, their exact q rows and the fork candidates.

Sampled requests draw from Saguaro's sigma (Definition 14): the request's temperature/top-k/top-p
applied to the draft logits, then the top M tokens down-weighted by beta. The returned q row *is*
sigma, bit for bit, so `saguaro.verify` stays exact (docs/design.md#sampled-drafts). Greedy requests
take the
argmax and carry no q. Each request draws with its own generator, independent of the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sglang_ssd.saguaro import SamplingBatch, saguaro_probs
from sglang_ssd.speculator.state import RequestState


@dataclass
class DraftSample:
    """Per row: the drawn token, its q (None for greedy rows) and the fork candidates.

    Attributes:
        tokens: int64 [N].
        q: list of N float32 [V] tensors or None.
        candidates: int64 [N, C], the C most likely draft tokens (by the draft's logits), best
            first; C = `num_candidates`.
        probs: float32 [N, C], the draft's probability of each candidate (`draft_probs_at`).
        token_probs: float32 [N], the draft's probability of the drawn token.
    """

    tokens: torch.Tensor
    q: list[torch.Tensor | None]
    candidates: torch.Tensor
    probs: torch.Tensor
    token_probs: torch.Tensor


def sampling_of(states: Sequence[RequestState]) -> SamplingBatch:
    """The `SamplingBatch` of `states`, one row each."""
    return SamplingBatch.from_lists(
        [s.temperature for s in states],
        [s.top_k for s in states],
        [s.top_p for s in states],
    )


def sample_drafts(
    logits: torch.Tensor,
    states: Sequence[RequestState],
    top_m: Sequence[int],
    beta: float,
    num_candidates: int,
) -> DraftSample:
    """Draw one draft token per row of `logits`.

    Args:
        logits: float [N, V], the draft's next-token logits; row i belongs to `states[i]`.
        states: the request of each row (several rows may share a request).
        top_m: M per row, how many top tokens sigma down-weights (M_j = F_j + 1); ignored when
            beta == 1.
        beta: Saguaro's β in (0, 1].
        num_candidates: C >= 1, fork candidates kept per row.

    Raises:
        ValueError: on shape mismatches or β outside (0, 1] (from `saguaro_probs`).
    """
    n, vocab = logits.shape
    if len(states) != n or len(top_m) != n:
        raise ValueError(f"logits rows {n} != states {len(states)} / top_m {len(top_m)}")
    logits = logits.float()
    candidates = torch.topk(logits, k=min(num_candidates, vocab), dim=-1).indices
    tokens = candidates[:, 0].clone()
    q: list[torch.Tensor | None] = [None] * n
    sampled = [i for i, s in enumerate(states) if not s.is_greedy]
    if sampled:
        rows = torch.tensor(sampled)
        sub_states = [states[i] for i in sampled]
        probs = saguaro_probs(
            logits[rows], torch.tensor([top_m[i] for i in sampled]), beta, sampling_of(sub_states)
        )
        for j, i in enumerate(sampled):
            token = torch.multinomial(probs[j], 1, generator=states[i].generator)
            tokens[i] = token[0]
            q[i] = probs[j]
    cand_probs = draft_probs_at(logits, states, torch.cat([candidates, tokens.view(-1, 1)], 1))
    return DraftSample(
        tokens=tokens,
        q=q,
        candidates=candidates,
        probs=cand_probs[:, :-1],
        token_probs=cand_probs[:, -1],
    )


def draft_probs_at(
    logits: torch.Tensor, states: Sequence[RequestState], index: torch.Tensor
) -> torch.Tensor:
    """float32 [N, K]: the draft's probability of tokens `index` (int64 [N, K], -1 gives 0)
    under softmax(logits / T), T the row's request temperature (1 for a greedy request):
    the confidence the outcome model (`saguaro.outcome_model`) calibrates.

    Args:
        logits: float [N, V], row i belonging to `states[i]`.
    """
    temps = [1.0 if s.is_greedy else s.temperature for s in states]
    scaled = logits.float() / torch.tensor(temps, device=logits.device).view(-1, 1)
    logp = torch.log_softmax(scaled, dim=-1).gather(1, index.clamp_min(0))
    return torch.where(index >= 0, logp.exp(), 0.0)


def pad_rows(rows: list[torch.Tensor], width: int, fill: float = -1) -> torch.Tensor:
    """Stack 1-D rows into [len(rows), width], padding with `fill` (and cutting to width);
    int64 unless `fill` is a float (then float32: the candidates' probabilities, fill 0.0)."""
    dtype = torch.float32 if isinstance(fill, float) else torch.int64
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        r = r[:width]
        out[i, : r.numel()] = r
    return out

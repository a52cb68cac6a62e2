"""Per-position request options on the target's verify logits: penalties, min tokens, logit bias.

Plain decoding applies these to the logits of every step, conditioned on the output so far. A
verify forward scores D + 1 steps at once (root, d_1 .. d_D), so position j must see the output
*plus the draft prefix d_1 .. d_j*, exactly as plain decoding would have seen it had it emitted
that prefix. `shape_logits` does that; `saguaro.verify` then applies temperature, top-k/top-p and
min-p to the shaped logits. Exactness needs nothing else: the accept/reject rule compares q
against the p plain decoding would sample from at each position
(docs/design.md#options-that-change-p).

Formulas (SGLang 0.5.23 `sampling/penaltylib`, output tokens only, c_t the count of token t in
the output so far):
- frequency:  z_t -= f * c_t
- presence:   z_t -= r * 1{c_t > 0}
- min tokens: z_t = -inf for t in the stop set while len(output) < min_new_tokens
- repetition: z_t *= rho if z_t < 0 else 1 / rho, for c_t > 0
- logit bias: z_t += b_t
Additive penalties come before the repetition scaling, as in SGLang's speculative and overlap
paths (its non-overlap decode iterates a `set` of penalizers, whose order is arbitrary when
repetition is combined with an additive penalty). The grammar mask (-inf) commutes with all of
them; the worker applies it with SGLang's own mask builder.

SGLang's own speculative verify is not exact here: it reuses the round's starting penalties at
every draft position (`BatchedPenalizerOrchestrator.apply(repeat=...)`), the "relaxed" form
`shape_logits(..., per_position=False)` reproduces for tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RequestOptions:
    """One request's options that change p (neutral values change nothing).

    Attributes:
        output_ids: the request's output tokens so far (prompt excluded).
        frequency_penalty: f, subtracted per occurrence.
        presence_penalty: r, subtracted once a token occurred.
        repetition_penalty: rho > 0, logits scaling of tokens that occurred.
        min_new_tokens: stop tokens are masked while fewer outputs exist.
        stop_ids: the token ids `min_new_tokens` masks (stop ids, EOS ids, tokenizer stops).
        logit_bias: token id -> additive bias.
    """

    output_ids: Sequence[int]
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    stop_ids: frozenset[int] = frozenset()
    logit_bias: Mapping[int, float] | None = None

    @property
    def penalized(self) -> bool:
        """Whether any count-based penalty applies."""
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def neutral(self) -> bool:
        """Whether these options leave p unchanged at every position."""
        return (
            not self.penalized
            and self.min_new_tokens <= len(self.output_ids)
            and not any(self.logit_bias.values() if self.logit_bias else ())
        )


def shape_logits(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    options: Sequence[RequestOptions],
    *,
    per_position: bool = True,
) -> None:
    """Apply each request's penalties, min tokens and logit bias at every verify position.

    Args:
        logits: float [B, W, V], the target's logits at [root, d_1 .. d_{W-1}] per request;
            modified in place. Position j is the step that follows output + d_1 .. d_j.
        draft_tokens: int64 [B, D], D <= W - 1; -1 pads a row shorter than D. Positions
            past a row's draft (which verify ignores) are left in an unspecified state.
        options: B `RequestOptions`, in batch order.
        per_position: False reproduces SGLang's relaxed speculative penalties (the round's
            starting counts at every position); only for tests' negative controls.

    Raises:
        ValueError: on inconsistent shapes.

    Source: SGLang 0.5.23 `sampling/penaltylib` (formulas);
    docs/design.md#options-that-change-p (applied to p before verify, per position).
    """
    batch, width = logits.shape[:2]
    if len(options) != batch or draft_tokens.shape[0] != batch or draft_tokens.shape[1] >= width:
        raise ValueError(
            f"logits {tuple(logits.shape)}, drafts {tuple(draft_tokens.shape)} and "
            f"{len(options)} options do not fit"
        )
    rows = [b for b, opt in enumerate(options) if opt.penalized]
    if rows:
        _apply_penalties(logits, draft_tokens, options, rows, per_position)
    for b, opt in enumerate(options):
        _apply_min_new_tokens(logits[b], opt)
        if opt.logit_bias:
            ids = torch.tensor(list(opt.logit_bias), dtype=torch.int64, device=logits.device)
            bias = torch.tensor(list(opt.logit_bias.values()), dtype=logits.dtype)
            logits[b, :, ids] += bias.to(logits.device)


def prefix_counts(
    output_ids: Sequence[Sequence[int]], draft_tokens: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token counts of output + d_1 .. d_j at each verify position j, over the tokens that occur.

    Only tokens of a row's output or draft can have a non-zero count, so the counts cover those
    columns alone (K per row, K <= len(output) + D), not the vocabulary: no [R, W, V] tensor.

    Args:
        output_ids: R output-id lists.
        draft_tokens: int64 [R, D], -1 padded, D <= width - 1.
        width: W, verify positions per row.

    Returns:
        (columns, counts): int64 [R, K], each row's token ids (sorted; a row with fewer than K
        repeats its first id, or holds 0 when it has none: repeated columns get equal counts),
        and float32 [R, W, K], row j counting the output and d_1 .. d_j (positions past D count
        the whole draft); both on `draft_tokens`' device.
    """
    rows, depth = len(output_ids), draft_tokens.shape[1]
    device = draft_tokens.device
    drafts = draft_tokens.tolist()  # [R, D] ids: one small copy to the host
    columns = [
        sorted({*ids, *(t for t in drafts[r] if t >= 0)}) for r, ids in enumerate(output_ids)
    ]
    k = max([1, *(len(c) for c in columns)])
    padded = [c + [c[0] if c else 0] * (k - len(c)) for c in columns]
    base = []
    for ids, cols in zip(output_ids, padded, strict=True):
        seen = Counter(ids)
        base.append([float(seen[c]) for c in cols])
    ids = torch.tensor(padded, dtype=torch.int64, device=device)
    counts = torch.tensor(base, dtype=torch.float32, device=device).view(rows, 1, k)
    counts = counts.repeat(1, width, 1)
    if depth:
        valid = (draft_tokens >= 0).unsqueeze(2)
        hits = ((draft_tokens.unsqueeze(2) == ids.unsqueeze(1)) & valid).float()  # [R, D, K]
        counts[:, 1 : depth + 1] += hits.cumsum(dim=1)
        counts[:, depth + 1 :] += hits.sum(dim=1, keepdim=True)
    return ids, counts


def _apply_penalties(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    options: Sequence[RequestOptions],
    rows: list[int],
    per_position: bool,
) -> None:
    width = logits.shape[1]
    index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
    drafts = draft_tokens.to(logits.device)[index]
    if not per_position:
        drafts = torch.full_like(drafts, -1)
    columns, counts = prefix_counts([options[b].output_ids for b in rows], drafts, width)

    def column(name: str) -> torch.Tensor:
        values = [float(getattr(options[b], name)) for b in rows]
        return torch.tensor(values, dtype=torch.float32, device=logits.device).view(-1, 1, 1)

    # [R, W, K] views of the logits at each row's columns (gathered, then written back).
    at = (
        index.view(-1, 1, 1),
        torch.arange(width, device=logits.device).view(1, -1, 1),
        columns.unsqueeze(1),
    )
    present = counts > 0
    shaped = logits[at].float()
    shaped -= column("frequency_penalty") * counts + column("presence_penalty") * present
    rho = column("repetition_penalty")
    scaled = torch.where(shaped < 0, shaped * rho, shaped / rho)
    logits[at] = torch.where(present, scaled, shaped).to(logits.dtype)


def _apply_min_new_tokens(logits: torch.Tensor, opt: RequestOptions) -> None:
    """logits: [W, V] of one request; mask its stop set at positions j with
    len(output) + j < min_new_tokens (j draft tokens precede position j)."""
    masked = opt.min_new_tokens - len(opt.output_ids)
    if masked <= 0 or not opt.stop_ids:
        return
    ids = torch.tensor(sorted(opt.stop_ids), dtype=torch.int64, device=logits.device)
    ids = ids[ids < logits.shape[1]]
    logits[:masked, ids] = float("-inf")

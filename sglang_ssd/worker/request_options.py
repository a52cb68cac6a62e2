"""Shape the target's verify logits with each request's options before `saguaro.verify`.

Penalties, min tokens and logit bias go through `sglang_ssd.saguaro.shaping` (per position,
counting the draft prefix). Grammars (regex, JSON schema, EBNF, structural tags, the OpenAI
`response_format` and tool calls SGLang turns into them) go through SGLang's own host-side mask
builder over the verify chain (`GrammarTree.from_linear_chain`, `build_grammar_vocab_mask`): it
walks each request's grammar down [root, d_1 .. d_D], fills the mask of every position whose
prefix the grammar accepts, and rolls the grammar back, so its state is unchanged. A draft token
the grammar refuses has p = 0 at its position and is rejected there, so the positions after it
never matter. The scheduler advances the grammar over the verified run itself
(`advance_grammar_fsm`), as for SGLang's own speculative algorithms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sglang_ssd.saguaro.shaping import RequestOptions, shape_logits

# SGLang `SamplingParams` fields this module applies to p per verify position.
SHAPED_OPTIONS = (
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "logit_bias",
)
GRAMMAR_OPTIONS = ("regex", "json_schema", "ebnf", "structural_tag", "ebnf_full_assistant")


def request_options(req: Any) -> RequestOptions:
    """A SGLang `Req`'s options, with the stop set SGLang's `BatchedMinNewTokensPenalizer`
    masks (the request's stop token ids, its EOS ids, the tokenizer's EOS and extra stops)."""
    params = req.sampling_params
    stop_ids: set[int] = set()
    if params.min_new_tokens > 0:
        tokenizer = getattr(req, "tokenizer", None)
        stop_ids |= set(params.stop_token_ids or ())
        stop_ids |= set(getattr(req, "eos_token_ids", None) or ())
        if tokenizer is not None:
            stop_ids |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
            if tokenizer.eos_token_id is not None:
                stop_ids.add(tokenizer.eos_token_id)
    bias = params.logit_bias
    return RequestOptions(
        output_ids=req.output_ids,
        frequency_penalty=float(params.frequency_penalty),
        presence_penalty=float(params.presence_penalty),
        repetition_penalty=float(params.repetition_penalty),
        min_new_tokens=int(params.min_new_tokens),
        stop_ids=frozenset(t for t in stop_ids if t is not None),
        logit_bias={int(k): float(v) for k, v in bias.items()} if bias else None,
    )


def shape_verify_logits(
    batch: Any, logits: torch.Tensor, verify_ids: torch.Tensor, draft_tokens: torch.Tensor
) -> None:
    """Apply every request's options to a verify forward's logits, in place.

    Args:
        batch: SGLang's `ScheduleBatch` (its `reqs`, `has_grammar`, `sampling_info`).
        logits: float [B * W, V], the verify forward's `next_token_logits`.
        verify_ids: int64 [B, W] on the CPU, the forward's tokens [root, d_1 .. d_{W-1}].
        draft_tokens: int64 [B, D], the round's drafts (-1 padded), D <= W - 1.
    """
    reqs: Sequence[Any] = batch.reqs
    width = verify_ids.shape[1]
    options = [request_options(req) for req in reqs]
    if not all(opt.neutral for opt in options):
        shape_logits(logits.view(len(reqs), width, -1), draft_tokens, options)
    if batch.has_grammar:
        _apply_grammar_mask(batch, logits, verify_ids)


def _apply_grammar_mask(batch: Any, logits: torch.Tensor, verify_ids: torch.Tensor) -> None:
    from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

    mask = build_grammar_vocab_mask(
        reqs=batch.reqs,
        tree=GrammarTree.from_linear_chain(verify_ids),
        sampling_info=batch.sampling_info,
        device=logits.device,
        barrier=None,  # SSD schedules synchronously: the grammar holds every committed token
    )
    if mask is not None:
        mask.apply(logits)

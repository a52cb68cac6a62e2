"""SGLang requests in the link's terms: what the speculator client puts in `Open` and `Step`.

Pure functions (no link, no state): the outcome a Step reports for a request, its sampling
options, whether it ends at its prefill, and the Step itself with the target features it
carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from sglang_ssd.saguaro.sampling import TOP_K_ALL
from sglang_ssd.transport import FeatureSpan, Open, Outcome, SamplingSpec, Step

if TYPE_CHECKING:
    from sglang_ssd.worker.planner import StepChoice


def outcome_since(
    rid: str, tokens: Sequence[int], known: int | None, pending: tuple[int, int] | None
) -> Outcome | None:
    """What the speculator must learn about a request since the last Step that carried it.

    Args:
        rid: the request.
        tokens: all its tokens now (prompt + output).
        known: how many of them the speculator holds (None: it does not know the request).
        pending: (k, bonus) verified in its last speculative round, None if there was none
            since (a new request, or one whose round was not reported).

    Returns:
        The `Outcome`: k accepted draft tokens, the bonus, then as `extra` the tokens plain
        rounds committed since; or None when `tokens` do not continue what the speculator
        holds that way (the caller re-opens the request) or hold nothing new.
    """
    k, bonus = pending if pending is not None else (0, None)
    if known is None:
        return None
    at = known + k  # where the outcome's bonus sits in `tokens`
    if at >= len(tokens) or bonus not in (None, tokens[at]):
        return None
    return Outcome(rid=rid, accept_len=k, bonus=tokens[at], extra=list(tokens[at + 1 :]))


def open_message(req: Any, tokens: list[int], prespeculate: bool = False) -> Open:
    """The `Open` of an SGLang `Req` whose committed `tokens` the speculator is to prefill;
    `prespeculate`: build its speculation cache right away (async mode, at prefill)."""
    return Open(
        rid=req.rid, token_ids=tokens, sampling=sampling_spec(req), prespeculate=prespeculate
    )


def step_message(
    step_id: int,
    outcomes: list[Outcome],
    rids: list[str],
    choice: StepChoice,
    spans: list[FeatureSpan],
    features: torch.Tensor | None,
    draft_cpus: list[int] | None = None,
) -> Step:
    """The Step asking drafts for `rids` (batch order), with the outcomes since the previous
    one, the planner's `choice` (backup, tree depth), the spans of `features` ([N, F] or
    None: `FeatureBuffer.take`) that follow it on the tensor link and the cores its drafts run
    on (`draft_cpus`: None or empty for the speculator's own).

    Raises:
        ValueError: features of a dtype the link does not carry (`feature_dtype`).
    """
    return Step(
        step_id=step_id,
        outcomes=outcomes,
        requests=rids,
        backup=choice.backup,
        tree_depth=choice.tree_depth,
        prespeculate=choice.prespeculate,
        draft_cpus=list(draft_cpus or ()),
        features=spans,
        feature_size=0 if features is None else int(features.shape[1]),
        feature_dtype=feature_dtype(features),
    )


def feature_dtype(features: torch.Tensor | None) -> str:
    """`Step.feature_dtype` of a features tensor (the default when there is none).

    Raises:
        ValueError: a dtype the protocol does not carry (bfloat16, float16, float32 only)."""
    if features is None:
        return "bfloat16"
    name = str(features.dtype).removeprefix("torch.")
    if name not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"target features of dtype {name}: the link carries 16/32-bit floats")
    return name


def ends_at_prefill(req: Any) -> bool:
    """Whether the request finishes with the token its prefill samples (`max_new_tokens` <= 1),
    before any decode round."""
    limit = req.sampling_params.max_new_tokens
    return limit is not None and int(limit) <= 1


def sampling_spec(req: Any) -> SamplingSpec:
    """The request's sampling options in the protocol's terms (greedy → top_k 1)."""
    sp = req.sampling_params
    top_k = int(sp.top_k)
    if top_k < 0 or top_k >= TOP_K_ALL:  # SGLang's "whole vocabulary": -1 on the wire
        top_k = -1
    seed = getattr(sp, "sampling_seed", None)
    return SamplingSpec(
        temperature=float(sp.temperature),
        top_k=top_k,
        top_p=float(sp.top_p),
        seed=None if seed is None else int(seed),
    )

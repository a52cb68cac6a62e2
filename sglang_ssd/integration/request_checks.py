"""Refuse requests whose sampling options SSD cannot apply exactly to p (HTTP 400).

SSD verifies every draft against the target's p built from temperature, top-k, top-p and min-p
only (`sglang_ssd.saguaro.verify`, DESIGN.md §1). Options that SGLang's own sampler would also
apply to p (penalties, EOS masking by `min_new_tokens`, `logit_bias`, grammars, custom logit
processors, beam search) would be silently ignored, so an SSD server refuses them instead.

The same check runs at three places (see `sglang_ssd.integration.hooks`):
- `/generate` before its streaming response starts, so streamed requests get a real 400;
- the OpenAI completions / chat adapters after they build SGLang's sampling parameters
  (response_format and tool_choice become grammars there);
- the tokenizer manager for every request it tokenizes (Engine API, server-side
  `preferred_sampling_params`), as the last line.
Refusals raise `SSDRequestError` (a `ValueError`), which SGLang's routes turn into HTTP 400.
`check_prompt` also refuses the two prompts that crash SGLang 0.5.23's scheduler (empty, token
ids outside the vocabulary). Server-wide flags that change p are refused at startup
(`registration.validate_ssd_server_args`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# (option, neutral value): numeric options that change p unless neutral.
_NUMERIC_NEUTRAL: tuple[tuple[str, float], ...] = (
    ("repetition_penalty", 1.0),
    ("frequency_penalty", 0.0),
    ("presence_penalty", 0.0),
    ("min_new_tokens", 0.0),
)
_GRAMMARS = ("regex", "json_schema", "ebnf", "structural_tag")
_HINT = (
    "SSD verifies drafts against the target distribution after temperature, top_k, top_p and "
    "min_p only; drop the option or use a server without --speculative-algorithm SSD"
)


class SSDRequestError(ValueError):
    """A request option SSD refuses; SGLang maps `ValueError` to HTTP 400."""

    status_code = 400


def _get(params: Any, name: str) -> Any:
    if isinstance(params, Mapping):
        return params.get(name)
    return getattr(params, name, None)


def _refuse(option: str) -> str:
    return f"SSD cannot apply {option} exactly; {_HINT}."


def sampling_refusal(params: Any) -> str | None:
    """Why SSD refuses these sampling parameters, or None when it applies them exactly.

    Args:
        params: a `sampling_params` dict as a client sent it, or SGLang's `SamplingParams`.
            Values SGLang itself rejects (wrong types) are left for SGLang to report.
    """
    if params is None:
        return None
    for name, neutral in _NUMERIC_NEUTRAL:
        value = _get(params, name)
        try:
            changed = value is not None and float(value) != neutral
        except (TypeError, ValueError):
            continue
        if changed:
            return _refuse(f"{name}={value}")
    bias = _get(params, "logit_bias")
    if isinstance(bias, Mapping) and any(_nonzero(v) for v in bias.values()):
        return _refuse("logit_bias")
    for name in _GRAMMARS:
        if _get(params, name):
            return _refuse(f"a {name} grammar constraint")
    beam_width = _get(params, "beam_width")
    if isinstance(beam_width, int) and beam_width > 1:
        return _refuse(f"beam search (beam_width={beam_width})")
    return None


def _nonzero(value: Any) -> bool:
    try:
        return float(value) != 0.0
    except (TypeError, ValueError):
        return True


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def request_refusal(
    sampling_params: Any, custom_logit_processor: Any = None, watermark: Any = None
) -> str | None:
    """`sampling_refusal` over a single or batched request, plus its request-level options.

    Args:
        sampling_params: one sampling-params dict/`SamplingParams`, or a list (batch).
        custom_logit_processor: the request's serialized processor(s), if any.
        watermark: a request-level watermark config, if any.
    """
    if any(p for p in _as_list(custom_logit_processor)):
        return _refuse("a custom_logit_processor")
    if watermark is not None:
        return _refuse("a watermark")
    for params in _as_list(sampling_params):
        reason = sampling_refusal(params)
        if reason is not None:
            return reason
    return None


def check_generate_input(obj: Any) -> None:
    """Raise `SSDRequestError` for a `GenerateReqInput` SSD cannot serve exactly."""
    reason = request_refusal(
        getattr(obj, "sampling_params", None),
        getattr(obj, "custom_logit_processor", None),
        getattr(obj, "watermark", None),
    )
    if reason is not None:
        raise SSDRequestError(reason)


def check_prompt(input_ids: Any, vocab_size: int) -> None:
    """Raise `SSDRequestError` for an empty prompt or token ids outside ``[0, vocab_size)``.

    SGLang 0.5.23 sends both to the model, which raises in the scheduler and takes the whole
    server down.
    """
    if input_ids is None:
        return
    if len(input_ids) == 0:
        raise SSDRequestError("the prompt is empty: give at least one token of text or input_ids")
    bad = [t for t in input_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise SSDRequestError(
            f"input_ids must be token ids in [0, {vocab_size - 1}]; got {bad[:5]}"
            + (" ..." if len(bad) > 5 else "")
        )


def check_tokenized(tokenized: Any) -> None:
    """Raise `SSDRequestError` for a tokenized request (SGLang's normalized `SamplingParams`,
    server defaults merged in)."""
    params = getattr(tokenized, "sampling_params", None)
    reason = request_refusal(
        params,
        getattr(tokenized, "custom_logit_processor", None),
        _get(params, "watermark"),
    )
    if reason is not None:
        raise SSDRequestError(reason)

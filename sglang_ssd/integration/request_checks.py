"""Refuse requests whose options SSD cannot apply exactly to p (HTTP 400).

SSD applies to p, per verify position, everything SGLang's sampler applies in plain decoding:
temperature, top-k, top-p, min-p (`sglang_ssd.saguaro.verify`), penalties, min tokens and logit
bias (`sglang_ssd.saguaro.shaping`), grammars (SGLang's mask builder,
`sglang_ssd.worker.request_options`). What it refuses is what cannot be applied per position:
- custom logit processors: arbitrary code SGLang calls once per step on the batch's logits, with
  state of its own; SSD would have to call it at each draft position with a draft prefix the
  processor never sees, so the result could not be plain decoding's p;
- watermarks: the green list depends on the previous token, which SGLang's watermarking reads
  from committed state only;
- beam search: it keeps several hypotheses per request, SSD verifies one chain.

The same check runs at three places (see `sglang_ssd.integration.hooks`):
- `/generate` before its streaming response starts, so streamed requests get a real 400;
- the OpenAI completions / chat adapters after they build SGLang's sampling parameters;
- the tokenizer manager for every request it tokenizes (Engine API, server-side
  `preferred_sampling_params`), as the last line.
Refusals raise `SSDRequestError` (a `ValueError`), which SGLang's routes turn into HTTP 400.
`check_prompt` also refuses the two prompts that crash SGLang 0.5.23's scheduler (empty, token
ids outside the vocabulary). Server-wide flags SSD cannot honour are refused at startup
(`registration.validate_ssd_server_args`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_HINT = "drop the option or use a server without --speculative-algorithm SSD"
_WHY = {
    "a custom_logit_processor": (
        "SGLang calls it once per decoding step on committed state, and SSD would have to call "
        "it at every draft position with a draft prefix the processor cannot be given"
    ),
    "a watermark": "its green list is seeded from committed tokens only, not per draft position",
}


class SSDRequestError(ValueError):
    """A request option SSD refuses; SGLang maps `ValueError` to HTTP 400."""

    status_code = 400


def _get(params: Any, name: str) -> Any:
    if isinstance(params, Mapping):
        return params.get(name)
    return getattr(params, name, None)


def _refuse(option: str, why: str = "SSD verifies one chain per request") -> str:
    return f"SSD cannot apply {option} exactly ({why}); {_HINT}."


def sampling_refusal(params: Any) -> str | None:
    """Why SSD refuses these sampling parameters, or None when it applies them exactly.

    Args:
        params: a `sampling_params` dict as a client sent it, or SGLang's `SamplingParams`.
            Values SGLang itself rejects (wrong types) are left for SGLang to report.
    """
    if params is None:
        return None
    beam_width = _get(params, "beam_width")
    if isinstance(beam_width, int) and beam_width > 1:
        return _refuse(f"beam search (beam_width={beam_width})")
    return None


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
        return _refuse("a custom_logit_processor", _WHY["a custom_logit_processor"])
    if watermark is not None:
        return _refuse("a watermark", _WHY["a watermark"])
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

"""Finish a verify round's accepted run where plain decoding would have finished it.

A verify round appends up to γ + 1 tokens to a request at once; SGLang's
`Req.update_finish_state(new_accepted_len)` then checks them for a finish in a fixed order:
stop strings and stop regexes first (anywhere in the run), then stop tokens / EOS, then the length
limit. Plain decoding checks after every token, so an EOS (or `stop_token_ids` entry) that comes
before a stop-string match in the same run ends the output at the EOS; SGLang's order would
report the stop string and emit the tokens after the EOS (docs/design.md#the-greedy-rule: SSD's
output must equal
plain decoding's).

`update_finish_state` (hook, AROUND `Req.update_finish_state`, SSD servers only): when the run
holds a stop token before its last position, SGLang's own check runs on the output as it stood
right after that token (the tokens after it are hidden for the call and restored after), so a
stop string or regex that completes at or before the stop token still wins, as in plain
decoding, and one that completes after it cannot. SGLang's rules decide what a stop token is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sglang_ssd.integration.registration import is_ssd


@functools.cache
def _serves_ssd() -> bool:
    """Whether this process's server runs SSD (read once per process)."""
    from sglang.srt.runtime_context import get_server_args

    return is_ssd(getattr(get_server_args(), "speculative_algorithm", None))


def first_stop_token_end(req: Any, new_accepted_len: int) -> int | None:
    """The output length just past the first stop token (EOS, `stop_token_ids`, the tokenizer's
    extra stop ids; none under `ignore_eos`) among the last `new_accepted_len` output ids of
    `req` (a SGLang `Req`), by SGLang's own `_check_token_based_finish`; None if there is none.
    `req`'s finish state is left as it was."""
    saved = req.finished_reason, req.finished_len
    try:
        new_tokens = list(req.output_ids[len(req.output_ids) - new_accepted_len :])
        if not req._check_token_based_finish(new_tokens):
            return None
        return int(req.finished_len)
    finally:
        req.finished_reason, req.finished_len = saved


def update_finish_state(
    original: Callable[..., Any], req: Any, new_accepted_len: int = 1, *args: Any, **kwargs: Any
) -> Any:
    """Hook (AROUND `Req.update_finish_state`): see the module docstring."""
    if new_accepted_len <= 1 or req.finished() or req.to_finish or not _serves_ssd():
        return original(req, new_accepted_len, *args, **kwargs)
    end = first_stop_token_end(req, new_accepted_len)
    full = req.output_ids
    if end is None or end >= len(full):
        return original(req, new_accepted_len, *args, **kwargs)
    view = full[:end]
    req.output_ids = view
    try:
        return original(req, new_accepted_len - (len(full) - end), *args, **kwargs)
    finally:
        full[:end] = view  # keep any id SGLang rewrote (its vocabulary-boundary check does)
        req.output_ids = full

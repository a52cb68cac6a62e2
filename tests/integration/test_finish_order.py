"""`integration.finish_order`: a verify round's run finishes where token-by-token decoding would.

The oracle is SGLang itself, one token at a time: the same `Req`, its output grown by one token
per `update_finish_state(1)` call, until it finishes (what plain decoding does). The hook, given
the whole run at once, must give the same finish reason (type and matched) and finished length.
Runs use the tiny models' character tokenizer: `~` is an EOS id (as in `test_ssd_stops.py`), and
SGLang decodes the characters space-separated, so stop strings are written that way.
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from sglang_ssd.integration import finish_order
from sglang_ssd.testing.tiny_models import make_tiny_model, tokenize

PROMPT = "x = "
(EOS_ID,) = tokenize("~")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny models' tokenizer, as SGLang's scheduler loads it."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")))


@pytest.fixture
def serves_ssd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(finish_order, "_serves_ssd", lambda: True)


def _req(tokenizer: Any, output: str, **sampling: Any) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(**{"max_new_tokens": 50, **sampling})
    params.normalize(tokenizer)
    req = Req("r", PROMPT, array("q", tokenize(PROMPT)), params, eos_token_ids={EOS_ID})
    req.tokenizer = tokenizer
    req.output_ids.extend(tokenize(output))
    return req


def _finish(req: Any) -> tuple[Any, ...]:
    reason = req.finished_reason
    return type(reason).__name__, getattr(reason, "matched", None), req.finished_len


def _one_token_at_a_time(tokenizer: Any, output: str, run: int, **sampling: Any) -> tuple:
    """SGLang's finish when the output's last `run` tokens arrive one per step."""
    for end in range(len(output) - run + 1, len(output) + 1):
        req = _req(tokenizer, output[:end], **sampling)
        req.update_finish_state(1)
        if req.finished():
            return _finish(req)
    return None, None, None


def _hooked(tokenizer: Any, output: str, run: int, **sampling: Any) -> tuple:
    from sglang.srt.managers.schedule_batch import Req

    req = _req(tokenizer, output, **sampling)
    before = list(req.output_ids)
    finish_order.update_finish_state(Req.update_finish_state, req, run)
    assert list(req.output_ids) == before, "the output ids must be restored"
    return _finish(req)


# (output, tokens of the final run, sampling): the finish falls inside the run in each.
CASES = [
    ("za~bcd", 4, {"stop": ["b c"]}),  # EOS, then a stop string completing after it
    ("za~bcd", 5, {"stop": ["~ b"]}),  # a stop string that spans the EOS
    ("zbc~d", 4, {"stop": ["b c"]}),  # a stop string completing before the EOS
    ("zab~", 3, {"stop": ["a b"]}),  # EOS last in the run
    ("za~bcd", 4, {"stop": ["b c"], "ignore_eos": True}),
    ("za~bcd", 5, {"stop": ["b c"], "max_new_tokens": 2}),  # the length cap comes first
    ("za~bcd", 5, {"stop": ["c d"], "max_new_tokens": 3}),  # EOS at the cap
    ("zaqbcd", 5, {"stop": ["c d"], "stop_token_ids": [tokenize("q")[0]]}),
    ("za~bcd", 5, {"stop_regex": [r"b\s*c"]}),
    ("za~bcd", 5, {}),  # EOS only
    ("zabcde", 5, {"stop": ["c d"]}),  # no stop token: SGLang's own order
]


@pytest.mark.parametrize(("output", "run", "sampling"), CASES)
def test_a_run_finishes_where_one_token_at_a_time_would(
    tokenizer: Any, serves_ssd: None, output: str, run: int, sampling: dict
) -> None:
    expected = _one_token_at_a_time(tokenizer, output, run, **sampling)
    assert expected[0] is not None, "the case must finish inside its run"
    assert _hooked(tokenizer, output, run, **sampling) == expected


def test_sglang_alone_emits_past_the_eos(tokenizer: Any) -> None:
    """The fault the hook exists for: SGLang's order reports the later stop string."""
    req = _req(tokenizer, "za~bcd", stop=["b c"])
    req.update_finish_state(4)
    assert _finish(req) == ("FINISH_MATCHED_STR", "b c", 5)
    assert _one_token_at_a_time(tokenizer, "za~bcd", 4, stop=["b c"]) == (
        "FINISH_MATCHED_TOKEN",
        EOS_ID,
        3,
    )


def test_other_algorithms_keep_sglangs_order(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglang.srt.managers.schedule_batch import Req

    monkeypatch.setattr(finish_order, "_serves_ssd", lambda: False)
    req = _req(tokenizer, "za~bcd", stop=["b c"])
    finish_order.update_finish_state(Req.update_finish_state, req, 4)
    assert _finish(req) == ("FINISH_MATCHED_STR", "b c", 5)

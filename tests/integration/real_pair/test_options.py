"""Options that shape p, on the real pair: greedy SSD equals plain decoding for each.

One batched `/generate` of requests (HumanEval prompts, 10 new tokens each, 32 for JSON), each
with another option: a JSON schema (CI's smoke); frequency, presence and repetition penalties, a
logit bias and min_new_tokens with a newline stop (`make test-real`). The same batch goes to
the package's AR
server (which runs with `--disable-overlap-schedule`: SGLang's overlap scheduler lags the
penalizers by one token, see docs/design.md#request-options-in-detail) and to its SSD server.

docs/design.md#the-greedy-rule greedy rule, with the shaped p: a divergence is allowed only where
AR's own
top-2 logprob margin at that position (its shaped, greedy logprobs; logit margins, since both
share one normaliser) is below ε = `DEFAULT_MARGIN_EPS`. The outputs are compared up to the
first divergence; allowed ones are printed.
"""

from __future__ import annotations

import json

import pytest
import requests

from eval.datasets import load_tokenizer
from sglang_ssd.testing.greedy import DEFAULT_MARGIN_EPS

from .pair import humaneval_ids

pytestmark = pytest.mark.integration

NEW_TOKENS = 10  # a 2-core AVX2 CPU verifies slowly (2-4 s per SSD round): keep it short
MIN_TOKENS = 8
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "lines": {"type": "integer"}},
    "required": ["name", "lines"],
    "additionalProperties": False,
}


def _options(newline: int, bias_token: int) -> dict[str, dict]:
    return {
        "frequency_penalty": {"frequency_penalty": 1.0},
        "presence_penalty": {"presence_penalty": 0.8},
        "repetition_penalty": {"repetition_penalty": 1.3},
        "logit_bias": {"logit_bias": {str(bias_token): 4.0}},
        "min_new_tokens": {"min_new_tokens": MIN_TOKENS, "stop_token_ids": [newline]},
        "json_schema": {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 32},
    }


SHAPING = ["frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias"]
OPTION_SETS = [
    pytest.param(["json_schema"], id="json-schema"),
    pytest.param(
        [*SHAPING, "min_new_tokens"], id="penalties-bias-min-tokens", marks=pytest.mark.real
    ),
]


def _batch(url: str, prompts: list[list[int]], options: list[dict], logprobs: bool) -> list:
    sampling = [{"max_new_tokens": NEW_TOKENS, "temperature": 0.0} | o for o in options]
    body = {"input_ids": prompts, "sampling_params": sampling}
    if logprobs:
        body |= {"return_logprob": True, "top_logprobs_num": 2}
    reply = requests.post(f"{url}/generate", json=body, timeout=1800)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _margin(ar: dict, position: int) -> float:
    top = ar["meta_info"]["output_top_logprobs"][position]
    return float(top[0][0]) - float(top[1][0])


@pytest.mark.parametrize("names", OPTION_SETS)
def test_each_option_greedy_matches_plain_decoding(pair, ar_server, ssd_server, names) -> None:
    tokenizer = load_tokenizer(pair[0])
    newline = tokenizer.convert_tokens_to_ids("Ċ")
    bias_token = tokenizer.encode(" result", add_special_tokens=False)[0]
    named = _options(newline, bias_token)
    options = [named[name] for name in names]
    base = humaneval_ids(pair[0], 3)
    # Each option keeps its prompt from the six-option batch this test once sent as a whole.
    prompts = [base[list(named).index(name) % len(base)] for name in names]
    expected = _batch(ar_server.url, prompts, options, logprobs=True)
    got = _batch(ssd_server.url, prompts, options, logprobs=False)
    by_name = dict(zip(names, zip(expected, got, strict=True), strict=True))
    allowed = []
    for option, ar, ssd in zip(options, expected, got, strict=True):
        want, have = ar["output_ids"], ssd["output_ids"]
        if have == want:
            continue
        position = next(
            (i for i, (a, b) in enumerate(zip(want, have, strict=False)) if a != b),
            min(len(want), len(have)),
        )
        assert position < min(len(want), len(have)), (option, "lengths differ", want, have)
        margin = _margin(ar, position)
        assert margin < DEFAULT_MARGIN_EPS, (option, position, margin, want, have)
        allowed.append((option, position, round(margin, 4)))
    print(f"allowed divergences (option, position, AR margin < {DEFAULT_MARGIN_EPS}): {allowed}")
    if "min_new_tokens" in by_name:
        min_tokens = by_name["min_new_tokens"][0]["output_ids"]
        assert newline not in min_tokens[:MIN_TOKENS], "min_new_tokens let the newline through"
    if "json_schema" in by_name:
        schema_run = by_name["json_schema"][1]
        if schema_run["meta_info"]["finish_reason"]["type"] == "stop":
            value = json.loads(schema_run["text"])
            assert set(value) == {"name", "lines"} and isinstance(value["lines"], int), value
    spec = [r["meta_info"].get("spec_accept_length", 0) for r in got]
    assert max(spec) > 1.5, f"SSD barely speculated under options: accept lengths {spec}"

"""Every sampling option SSD applies, served on the tiny pair and compared with plain decoding.

The session's shared tiny servers (`tiny_ar`, `tiny_ssd`; `tests/tiny_servers.py`): SSD, and
SGLang's autoregressive decoding with `--disable-overlap-schedule`. The reference must be the
non-overlap one: with the overlap scheduler, SGLang 0.5.23's penalizers count the prompt's
last token and lag the output by one step (`ScheduleBatch.cumulate_penalty_output_tokens`
reads `output_ids` before the overlapped step has written them), so the default AR server is
not plain decoding under penalties (see docs/design.md#request-options-in-detail). Greedy
SSD must equal it token for token for each option; greedy logprobs under penalties and a bias must
equal it within float tolerance; a JSON-schema request served together with plain requests must
equal it too; so must OpenAI chat requests constrained by `response_format` or a required / named
`tool_choice`. Both servers run with `--chunked-prefill-size` and `--enable-return-hidden-states`,
and SGLang's default `--grammar-backend` (xgrammar) (docs/flags.md, server flags), with
`--constrained-json-max-whitespace-cnt 2`: the tiny model, where
xgrammar's JSON grammar allows it, can emit whitespace until `max_new_tokens` (seen on an
AVX2-only CPU, where the tiny pair trains to other weights), so a schema-constrained answer
would never close; with at most 2 whitespace characters per gap `SCHEMA`'s JSON is bounded (a
name of at most 12 characters, a size of at most 3 digits) and must finish.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
from typing import Any

import pytest
import requests
from tiny_servers import CHUNK  # --chunked-prefill-size: LONG_PROMPT prefills in chunks

from eval.servers import Server

pytestmark = pytest.mark.integration

PROMPTS = ["def fibon", "hello world", "abcabc"]
LONG_PROMPT = "def total(values):\n    return sum(v for v in values if v > 0)\n" * 4
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "size": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["name", "size"],
    "additionalProperties": False,
}
OPTIONS: dict[str, dict[str, Any]] = {
    "frequency_penalty": {"frequency_penalty": 1.5},
    "presence_penalty": {"presence_penalty": 1.0},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "penalties_combined": {"frequency_penalty": 0.6, "presence_penalty": 0.3},
    "logit_bias": {"logit_bias": {"70": 3.0, "66": -2.0}},
    "regex": {"regex": "(abc|def)+ [0-9]{3}"},
    "ebnf": {"ebnf": 'root ::= "hello" " " ("world" | "there")'},
    "json_schema": {"json_schema": json.dumps(SCHEMA)},
}


@pytest.fixture
def servers(tiny_ar: Server, tiny_ssd: Server) -> dict[str, Server]:
    return {"ar": tiny_ar, "ssd": tiny_ssd}


def _generate(server: Server, prompt: str, **extra: Any) -> dict:
    sampling = {"max_new_tokens": 40, "temperature": 0.0, **extra.pop("sampling", {})}
    body = {"text": prompt, "sampling_params": sampling, **extra}
    response = requests.post(f"{server.url}/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def _both(servers: dict[str, Server], prompts: list[str], **extra: Any) -> list[tuple[dict, dict]]:
    """Each prompt on the AR and the SSD server, all requests in flight together (so SSD batches
    them); [(ar, ssd)] in prompt order."""
    with cf.ThreadPoolExecutor(2 * len(prompts)) as pool:
        futures = [
            (
                pool.submit(_generate, servers["ar"], p, **json.loads(json.dumps(extra))),
                pool.submit(_generate, servers["ssd"], p, **json.loads(json.dumps(extra))),
            )
            for p in prompts
        ]
        return [(a.result(), s.result()) for a, s in futures]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_greedy_with_option_matches_plain_decoding(servers, name: str) -> None:
    pairs = _both(servers, PROMPTS, sampling=OPTIONS[name])
    for prompt, (ar, ssd) in zip(PROMPTS, pairs, strict=True):
        assert ssd["output_ids"] == ar["output_ids"], (name, prompt, ar["text"], ssd["text"])
    accepted = sum(ssd["meta_info"]["spec_accept_length"] for _, ssd in pairs) / len(pairs)
    assert accepted > 1.0, f"{name}: SSD accepted no draft token (accept length {accepted})"


def test_min_new_tokens_masks_stops_inside_accepted_blocks(servers) -> None:
    """A stop token the output would hit early is masked until min_new_tokens outputs exist."""
    stop = _generate(servers["ar"], PROMPTS[0])["output_ids"][3]
    plain = {"stop_token_ids": [stop], "max_new_tokens": 40}
    short = _both(servers, PROMPTS, sampling=plain)
    longer = _both(servers, PROMPTS, sampling={**plain, "min_new_tokens": 12})
    for (ar_short, ssd_short), (ar, ssd) in zip(short, longer, strict=True):
        assert ssd_short["output_ids"] == ar_short["output_ids"]
        assert ssd["output_ids"] == ar["output_ids"]
        assert len(ar["output_ids"]) >= 12
    assert len(short[0][0]["output_ids"]) < 12, "the stop must come early without min tokens"


@pytest.mark.parametrize(
    "sampling",
    [
        {"frequency_penalty": 0.8, "presence_penalty": 0.4, "logit_bias": {"70": 1.5}},
        {"repetition_penalty": 1.2, "min_new_tokens": 8},
    ],
    ids=["additive_and_bias", "repetition_and_min_tokens"],
)
def test_logprobs_under_penalties_and_bias_match_plain_decoding(servers, sampling) -> None:
    """Returned logprobs are those of the shaped p (SGLang's greedy logprobs are the
    log-softmax of the penalized logits). Repetition is not combined with an additive penalty
    here: SGLang's non-overlap decode applies its penalizers in the iteration order of a set of
    classes, which differs between processes (docs/design.md#request-options-in-detail)."""
    extra = {"sampling": sampling, "return_logprob": True, "top_logprobs_num": 3}
    for ar, ssd in _both(servers, PROMPTS, **extra):
        assert ssd["output_ids"] == ar["output_ids"]
        for key in ("output_token_logprobs", "output_top_logprobs"):
            got, want = ssd["meta_info"][key], ar["meta_info"][key]
            assert len(got) == len(want) == len(ar["output_ids"])
            assert _logprob_values(got) == pytest.approx(_logprob_values(want), abs=1e-4)
            assert _token_ids(got) == _token_ids(want)


def test_json_schema_request_among_plain_requests(servers) -> None:
    """One schema-constrained request batched with plain ones: all equal plain decoding, and
    the constrained output parses and validates."""
    schema = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 60}
    with cf.ThreadPoolExecutor(8) as pool:
        runs = {
            name: [
                pool.submit(_generate, server, PROMPTS[0], sampling=schema),
                *(pool.submit(_generate, server, p) for p in PROMPTS),
            ]
            for name, server in servers.items()
        }
        outs = {name: [f.result() for f in futures] for name, futures in runs.items()}
    assert [o["output_ids"] for o in outs["ssd"]] == [o["output_ids"] for o in outs["ar"]]
    first = outs["ssd"][0]
    assert first["meta_info"]["finish_reason"]["type"] == "stop", first  # the JSON closed
    # The tiny tokenizer decodes with a space between tokens (see the tool_choice case).
    value = json.loads(first["text"].replace(" ", ""))
    assert set(value) == {"name", "size"} and isinstance(value["size"], int), value
    assert len(value["name"]) <= 12 and 0 <= value["size"] <= 999, value


def test_chunked_prefill_of_a_long_prompt_matches_plain_decoding(servers, tiny_target) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_target)(LONG_PROMPT)["input_ids"]
    assert len(ids) > 2 * CHUNK, "the prompt must span several prefill chunks"
    ((ar, ssd),) = _both(servers, [LONG_PROMPT])
    assert ssd["output_ids"] == ar["output_ids"]


def test_return_hidden_states_has_the_autoregressive_rows(servers) -> None:
    """One hidden-state row per position as AR returns them (the prompt's rows, then one per
    output token), of the target's width; values equal AR's within float tolerance."""
    import torch

    for ar, ssd in _both(servers, PROMPTS[:2], return_hidden_states=True):
        assert ssd["output_ids"] == ar["output_ids"]
        got, want = ssd["meta_info"]["hidden_states"], ar["meta_info"]["hidden_states"]
        shapes = [tuple(torch.tensor(g).shape) for g in got]
        assert shapes == [tuple(torch.tensor(w).shape) for w in want], (len(got), len(want))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(torch.tensor(g), torch.tensor(w), atol=1e-3, rtol=1e-3)


def _chat(server: Server, **body: Any) -> dict:
    # The tiny target would pad JSON with spaces to max_tokens: a frequency penalty ends that.
    body = {"model": "tiny", "max_tokens": 300, "temperature": 0, "frequency_penalty": 1.5, **body}
    reply = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["unit"],
            },
        },
    }
    for name in ("get_weather", "get_time")
]
CHAT_CASES: dict[str, dict[str, Any]] = {
    "tool_choice_required": {"tools": TOOLS, "tool_choice": "required"},
    "tool_choice_named": {
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
    },
    "response_format_json_schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    },
    "response_format_json_object": {"response_format": {"type": "json_object"}},
}


@pytest.mark.parametrize("name", list(CHAT_CASES))
def test_openai_constrained_chat_matches_plain_decoding(servers, name: str) -> None:
    messages = [{"role": "user", "content": "weather in paris, as json"}]
    with cf.ThreadPoolExecutor(2) as pool:
        futures = {
            server: pool.submit(_chat, servers[server], messages=messages, **CHAT_CASES[name])
            for server in ("ar", "ssd")
        }
        ar, ssd = (futures[server].result() for server in ("ar", "ssd"))
    assert ssd["message"] == ar["message"], name
    assert ssd["finish_reason"] == ar["finish_reason"] != "length", (name, ssd)
    if name.startswith("tool_choice"):
        # The tiny tokenizer decodes with a space between tokens, so SGLang's tool-call parser
        # sees no JSON in `content`; the tokens themselves follow the call schema.
        calls = json.loads(ssd["message"]["content"].replace(" ", ""))
        assert calls and all(set(c) == {"name", "parameters"} for c in calls), ssd
        assert all(c["parameters"]["unit"] in ("c", "f") for c in calls), ssd
        expected = {"get_time"} if name == "tool_choice_named" else {"get_weather", "get_time"}
        assert {c["name"] for c in calls} <= expected, ssd


def _logprob_values(rows: list) -> list[float]:
    if rows and isinstance(rows[0], list) and rows[0] and isinstance(rows[0][0], list):
        return [entry[0] for row in rows for entry in row]
    return [row[0] for row in rows]


def _token_ids(rows: list) -> list[int]:
    if rows and isinstance(rows[0], list) and rows[0] and isinstance(rows[0][0], list):
        return [entry[1] for row in rows for entry in row]
    return [row[1] for row in rows]

"""Inputs from public bug reports on other engines' speculative decoding, on the real pair
(marked `integration`). Each case goes to the package's shared AR and SSD
servers as one batched `/generate` or one short burst, greedy:

- stop strings that fire inside an accepted block (`'f'` in a letter list in CI's smoke; in
  `make test-real`, `'h'` there and `" 8,"` in a number list with `max_new_tokens` 4, 6, 8
  and 12 around it);
- `max_tokens` 1, 2, 3, 5, 8 with `ignore_eos` (offsets inside and across the first blocks of
  γ + 1 = 5): `usage.completion_tokens` and the logprob count;
- a one-word chat answer with `max_tokens` at its length − 1, + 0, + 1 (EOS and the limit
  together);
- accented, Cyrillic and CJK text: SSD equals AR, and SSD's streamed deltas of the CJK case
  join to the whole text with no U+FFFD;
- a `/generate` batch repeating one prompt (radix-cache hits): every item equals its solo output;
- 4 streaming clients in a row that close after the first chunk: nothing stays behind (running
  requests, the speculator's open requests, prefills and KV slots, the client's bookkeeping).

Every case but the first stop string is marked `real` (`make test-real`, outside CI's budget).
The sizes (sweep widths, token counts, client counts) are set for a 2-core AVX2-only CPU,
where an SSD verify of 5 tokens takes 2-4 s (the whole CI must fit 90 minutes on a machine that
slow); the tiny pair's tests put every stop kind at
every offset 0..γ of an accepted block (`test_ssd_stops.py`).

SSD must answer as AR does: text, output ids, `finish_reason` (type and matched) and
`completion_tokens`. Outputs may differ only by docs/design.md#the-greedy-rule rule
(`assert_greedy_same`).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import requests

from eval.datasets import load_tokenizer
from eval.servers import Server

from .same_output import assert_greedy_same

pytestmark = pytest.mark.integration

TIMEOUT_S = 900
LETTERS = "letters = ['a', 'b', 'c', 'd',"
NUMS = "nums = [1, 2, 3, 4, 5,"
COUNT = "Count from 1 to 40, one number per line:\n1\n2\n3\n"
NON_ASCII = (
    "# French words with accents\nwords = ['café', 'élève', 'naïve', 'garçon',",
    "# Russian greetings\ngreetings = ['привет', 'здравствуйте', 'доброе утро',",
    "# Chinese numerals\nnumerals = ['一', '二', '三', '四',",
)
REPEATED = "def fibonacci(n):\n    "
CLOSED_STREAMS = 4
NON_ASCII_TOKENS = 8
REPEATED_TOKENS = 16
SETTLE_TIMEOUT_S = 60  # a hang guard, not a speed claim


def _post(server: Server, path: str, body: dict[str, Any]) -> Any:
    response = requests.post(f"{server.url}{path}", json=body, timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    return response.json()


def _generate(server: Server, prompts: Sequence[str], sampling: Sequence[dict]) -> list[dict]:
    """One batched greedy `/generate`: the responses in request order."""
    params = [{"temperature": 0, **s} for s in sampling]
    return _post(server, "/generate", {"text": list(prompts), "sampling_params": params})


def _burst(call: Callable[[dict], Any], bodies: Sequence[dict]) -> list[Any]:
    """`call` on every body at once (a short burst); results in body order."""
    with cf.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(call, bodies))


def _both(
    ar: Server, ssd: Server, call: Callable[[Server], list[dict]]
) -> tuple[list[dict], list[dict]]:
    return call(ar), call(ssd)


@pytest.fixture(scope="module")
def tokenizer(pair) -> Any:
    return load_tokenizer(pair[0])


def _ids(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    return [list(tokenizer(t).input_ids) for t in texts]


@pytest.mark.parametrize(
    "stops", [pytest.param(["f"], id="f"), pytest.param(["h"], id="h", marks=pytest.mark.real)]
)
def test_stop_strings_in_a_letter_list(pair, tokenizer, ar_server, ssd_server, stops):
    sampling = [{"max_new_tokens": 32, "stop": [s]} for s in stops]
    prompts = [LETTERS] * len(stops)
    ar, ssd = _both(ar_server, ssd_server, lambda s: _generate(s, prompts, sampling))
    for stop, r in zip(stops, ar, strict=True):  # the case really is a stop inside the output
        assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}, r
    assert_greedy_same(pair[0], _ids(tokenizer, prompts), ar, ssd)
    # Several tokens per verify round: the stops fired inside accepted blocks.
    assert sum(r["meta_info"]["spec_accept_length"] for r in ssd) / len(ssd) > 1.5, ssd


@pytest.mark.real
def test_stop_string_with_max_new_tokens_swept_around_it(pair, tokenizer, ar_server, ssd_server):
    limits = [4, 6, 8, 12]
    sampling = [{"max_new_tokens": n, "stop": [" 8,"]} for n in limits]
    ar, ssd = _both(ar_server, ssd_server, lambda s: _generate(s, [NUMS] * len(limits), sampling))
    kinds = {r["meta_info"]["finish_reason"]["type"] for r in ar}
    assert kinds == {"length", "stop"}, [r["meta_info"]["finish_reason"] for r in ar]
    assert_greedy_same(pair[0], _ids(tokenizer, [NUMS] * len(limits)), ar, ssd)


def _completion(server: Server) -> Callable[[dict], dict]:
    return lambda body: _post(server, "/v1/completions", body)


@pytest.mark.real
def test_max_tokens_sweep_counts_every_token(ar_server, ssd_server):
    bodies = [
        {
            "prompt": COUNT,
            "max_tokens": n,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 1,
        }
        for n in (1, 2, 3, 5, 8)
    ]
    ar, ssd = _both(ar_server, ssd_server, lambda s: _burst(_completion(s), bodies))
    for body, a, s in zip(bodies, ar, ssd, strict=True):
        n = body["max_tokens"]
        for label, r in (("AR", a), ("SSD", s)):
            choice = r["choices"][0]
            assert r["usage"]["completion_tokens"] == n, (label, n, r["usage"])
            assert len(choice["logprobs"]["tokens"]) == n, (label, n, choice["logprobs"])
            assert choice["finish_reason"] == "length", (label, n, choice)
        assert s["choices"][0]["text"] == a["choices"][0]["text"], (n, a, s)
        assert s["choices"][0]["logprobs"]["tokens"] == a["choices"][0]["logprobs"]["tokens"]


@pytest.mark.real
def test_one_word_chat_answer_with_max_tokens_at_its_length(ar_server, ssd_server):
    messages = [
        {"role": "user", "content": "What is the capital of France? Answer with one word only."}
    ]
    chat = {"messages": messages, "temperature": 0}
    free = _post(ar_server, "/v1/chat/completions", {**chat, "max_tokens": 32})
    assert free["choices"][0]["finish_reason"] == "stop", free
    length = free["usage"]["completion_tokens"]
    bodies = [{**chat, "max_tokens": max(1, length + d)} for d in (-1, 0, 1)]
    ar, ssd = _both(
        ar_server,
        ssd_server,
        lambda s: _burst(lambda b: _post(s, "/v1/chat/completions", b), bodies),
    )
    for body, a, s in zip(bodies, ar, ssd, strict=True):
        got = (s["choices"][0]["message"]["content"], s["choices"][0]["finish_reason"])
        want = (a["choices"][0]["message"]["content"], a["choices"][0]["finish_reason"])
        assert got == want, (body["max_tokens"], want, got)
        assert s["usage"]["completion_tokens"] == a["usage"]["completion_tokens"], (a, s)
    assert {a["choices"][0]["finish_reason"] for a in ar} == {"length", "stop"}


def _streamed_text(server: Server, body: dict) -> str:
    """The concatenated text deltas of a streamed `/v1/completions`."""
    text = []
    with requests.post(
        f"{server.url}/v1/completions", json={**body, "stream": True}, stream=True, timeout=600
    ) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines(decode_unicode=False):
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data: ") :])
            text += [c["text"] for c in chunk["choices"]]
    return "".join(text)


@pytest.mark.real
def test_streamed_non_ascii_deltas_join_to_the_whole_text(pair, tokenizer, ar_server, ssd_server):
    sampling = [{"max_new_tokens": NON_ASCII_TOKENS}] * len(NON_ASCII)
    ar, ssd = _both(ar_server, ssd_server, lambda s: _generate(s, NON_ASCII, sampling))
    assert not any(r["text"].isascii() for r in ar), ar  # the cases really are multi-byte
    assert_greedy_same(pair[0], _ids(tokenizer, NON_ASCII), ar, ssd)
    # SSD's streaming, one request at a time: the streamed and the whole request run at batch 1.
    # The CJK case: three UTF-8 bytes per character, so deltas split inside characters most.
    prompt = NON_ASCII[-1]
    body = {"prompt": prompt, "max_tokens": NON_ASCII_TOKENS, "temperature": 0}
    whole = _post(ssd_server, "/v1/completions", body)["choices"][0]["text"]
    streamed = _streamed_text(ssd_server, body)
    assert streamed == whole, (prompt, whole, streamed)
    assert "\ufffd" not in streamed, (prompt, streamed)


@pytest.mark.real
def test_a_batch_repeating_one_prompt_gives_each_item_its_solo_output(
    pair, tokenizer, ar_server, ssd_server
):
    sampling = {"max_new_tokens": REPEATED_TOKENS}
    solo_ar = _generate(ar_server, [REPEATED], [sampling])
    solo_ssd = _generate(ssd_server, [REPEATED], [sampling])
    batch = _generate(ssd_server, [REPEATED] * 3, [sampling] * 3)
    ids = _ids(tokenizer, [REPEATED])
    assert_greedy_same(pair[0], ids, solo_ar, solo_ssd)
    assert_greedy_same(pair[0], ids * 3, solo_ssd * 3, batch)
    assert any(r["meta_info"]["cached_tokens"] > 0 for r in batch), batch  # radix hits


SPECULATOR_KEYS = (
    "open_requests",
    "prefilling_requests",
    "kv_slots_used",
    "target_opened",
    "target_pending",
    "target_tracked",
)


def _load(server: Server) -> dict[str, float]:
    """What must return to its baseline once no request is left: the scheduler's running and
    waiting requests and the speculator's `SPECULATOR_KEYS`."""
    stats = requests.get(f"{server.url}/ssd/stats", timeout=60).json()
    return {k: stats[k] for k in ("target_running", "target_waiting")} | {
        k: stats["speculator"][k] for k in SPECULATOR_KEYS
    }


def _close_after_first_chunk(server: Server, i: int) -> None:
    body = {
        "text": f"{REPEATED}# variant {i}\n",
        "sampling_params": {"max_new_tokens": 256, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    with requests.post(f"{server.url}/generate", json=body, stream=True, timeout=600) as r:
        assert r.status_code == 200, r.text
        next(line for line in r.iter_lines() if line.startswith(b"data: "))


@pytest.mark.real
def test_streams_closed_after_the_first_chunk_leave_nothing_behind(ssd_server):
    baseline = _load(ssd_server)
    for i in range(CLOSED_STREAMS):
        _close_after_first_chunk(ssd_server, i)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (now := _load(ssd_server)) != baseline:
            assert time.monotonic() < deadline, (i, baseline, now)
            time.sleep(0.5)
    stats = requests.get(f"{ssd_server.url}/ssd/stats", timeout=60).json()
    assert stats["restarts"] == 0 and stats["faults"] == 0, stats

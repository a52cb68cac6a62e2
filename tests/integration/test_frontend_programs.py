"""SGLang frontend-language programs on the tiny pair's SSD server, compared with plain decoding.

The programs of `tests/frontend_programs.py` (multi-turn chat under the chat template,
`select`, `fork` with parallel branches, regex-constrained `gen`s, a stop string,
streaming, `run_batch`) run greedy through SGLang's `RuntimeEndpoint` on the session's shared
tiny servers (`tiny_servers`), SSD and AR side by side. SSD must give the same text as AR in
every case, every constraint must hold, and no program may end with an error.

The tiny model's text is gibberish, so the checks are on form, not meaning. The tiny tokenizer
has one token per printable character, and SGLang decodes its output with a space before each
token (`tokens_of` undoes that). A constrained output must match its pattern token by token,
`select` must name one of its choices, and the stop string is picked from the unstopped output
so that it fires.
The real pair runs the same programs in `real_pair/test_frontend.py` (`make test-real`).
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest
from frontend_programs import BRANCHES, Outcome, assert_constraints, run_programs

from eval.servers import Server

pytestmark = pytest.mark.integration

MAX_TOKENS = 12
CASES = ("chat", "select", "fork", "regex", "batch", "stop", "stream")


def tokens_of(text: str) -> str:
    """The tiny tokenizer's output tokens in `text`, one character each: SGLang's detokenizer
    gives each a space before it (" a b c" is the three tokens "abc")."""
    assert set(text[0::2]) <= {" "}, f"not space-separated one-character tokens: {text!r}"
    return text[1::2]


@pytest.fixture(scope="module")
def outcomes(tiny_servers: dict[str, Server]) -> dict[str, Outcome]:
    """The programs on the shared AR and SSD servers, both at once."""
    with cf.ThreadPoolExecutor(2) as pool:
        futures = {
            name: pool.submit(run_programs, tiny_servers[name].url, MAX_TOKENS)
            for name in ("ar", "ssd")
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES)
def test_program_matches_plain_decoding(outcomes: dict[str, Outcome], case: str) -> None:
    assert outcomes["ssd"].values[case] == outcomes["ar"].values[case]


def test_every_call_was_speculative_and_produced_text(outcomes: dict[str, Outcome]) -> None:
    calls = outcomes["ssd"].calls
    assert len(calls) == len(outcomes["ar"].calls) >= 2 * BRANCHES
    assert all(call.text for call in calls), [c for c in calls if not c.text]
    accepted = [call.accept_length for call in calls]
    assert None not in accepted and sum(accepted) / len(accepted) > 1.0, accepted


@pytest.mark.parametrize("server", ["ar", "ssd"])
def test_constraints_hold(outcomes: dict[str, Outcome], server: str) -> None:
    out = outcomes[server]
    assert_constraints(out, tokens_of)
    # fp32 and one token per character: a solo request equals the same prompt in a batch
    assert out.values["batch"]["texts"][0].startswith(out.values["stop"]["text"])
    assert out.values["stream"]["text"] == out.values["batch"]["texts"][1]

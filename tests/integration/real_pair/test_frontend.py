"""SGLang frontend-language programs on the real pair, SSD against plain decoding (`real`).

The programs of `tests/frontend_programs.py` (chat under the Qwen chat template, `select`, `fork`,
regex-constrained `gen`s, a stop string, streaming, `run_batch`) run greedy on the package's
shared AR and SSD servers, AR first: SSD then uses the stop string picked from AR's output. Every
program must end without error and every constraint must hold on both servers. Each `gen` call
asks for logprobs, so its output token ids are known. An SSD call whose prompt and stop strings
AR also sent must give AR's tokens, except at a near-tie the greedy rule allows (`check_greedy`;
printed). After such a divergence the programs continue from other text, and the calls that
follow are not compared. The tiny pair's version runs in CI
(`tests/integration/test_frontend_programs.py`).
"""

from __future__ import annotations

import pytest
from frontend_programs import Outcome, assert_constraints, run_programs

from eval.datasets import load_tokenizer
from eval.servers import Server
from sglang_ssd.testing import check_greedy

from .same_output import report_divergences

pytestmark = [pytest.mark.integration, pytest.mark.real]

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def outcomes(servers: dict[str, Server]) -> dict[str, Outcome]:
    ar = run_programs(servers["ar"].url, MAX_TOKENS, logprobs=True)
    stop = ar.values["stop"]["stop"]
    return {"ar": ar, "ssd": run_programs(servers["ssd"].url, MAX_TOKENS, stop, logprobs=True)}


@pytest.mark.parametrize("server", ["ar", "ssd"])
def test_constraints_hold(outcomes: dict[str, Outcome], server: str) -> None:
    assert_constraints(outcomes[server])


@pytest.mark.parametrize("server", ["ar", "ssd"])
def test_logprobs_cover_the_output_tokens(outcomes: dict[str, Outcome], server: str) -> None:
    """One logprob row per output token (`completion_tokens`), stop strings included."""
    bad = [c for c in outcomes[server].calls if len(c.output_ids or ()) != c.completion_tokens]
    assert not bad, bad


def test_ssd_calls_match_plain_decoding(outcomes: dict[str, Outcome], pair) -> None:
    ar, ssd = outcomes["ar"], outcomes["ssd"]
    by_request = {(call.prompt, call.stop): call for call in ar.calls}
    pairs = [
        (by_request[c.prompt, c.stop], c) for c in ssd.calls if (c.prompt, c.stop) in by_request
    ]
    assert all(a.output_ids is not None and s.output_ids is not None for a, s in pairs)
    # the ids a call emitted (logprob rows past `completion_tokens` are the other test's)
    differ = [
        (a, s) for a, s in pairs
        if a.output_ids[: a.completion_tokens] != s.output_ids[: s.completion_tokens]
    ]  # fmt: skip
    if not differ:
        assert len(pairs) == len(ssd.calls) and ssd.values == ar.values
        return
    tokenizer = load_tokenizer(pair[0])
    check = check_greedy(
        pair[0],
        [tokenizer.encode(a.prompt) for a, _ in differ],
        [a.output_ids[: a.completion_tokens] for a, _ in differ],
        [s.output_ids[: s.completion_tokens] for _, s in differ],
    )
    report_divergences("frontend SSD vs AR", check)
    assert not check.violations, (check.violations, differ)

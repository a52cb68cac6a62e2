"""The real Qwen2.5-Coder pair through live servers (marked `integration`; pulls the models).

1. SGLang on this CPU (AR, our `sgl_kernel` shim, intel_amx backend) reproduces transformers'
   greedy output from the same bf16 weights: `TRANSFORMERS_PROMPTS` HumanEval prompt ×
   `AR_TOKENS` tokens (`make test-real`; CI checks the same path on the tiny pair:
   `tests/integration/test_sglang_cpu_path.py`).
2. SSD reproduces AR's greedy output: each of `PROMPT_SETS` (CI: a HumanEval prompt and an
   MT-Bench chat turn; `make test-real`: the first two HumanEval prompts) × `SSD_TOKENS` tokens,
   and it really speculates: the speculator is a separate process on disjoint cores, the cache
   hit rate is > 0 and the accept length is > 2.
Both under docs/design.md#the-greedy-rule rule: a divergence is allowed only where the target's fp32
top-2 margin
is below ε = `DEFAULT_MARGIN_EPS`; such positions are printed. After one, SSD's check goes on
teacher-forced (AR continues from SSD's prefix), so all of SSD's tokens are checked.
"""

from __future__ import annotations

import os

import pytest
import requests

from eval.datasets import BOTH, HUMANEVAL, load_prompts, load_tokenizer
from eval.lossless import continuation
from sglang_ssd.testing import check_greedy
from sglang_ssd.testing.greedy import generate_greedy, in_child
from sglang_ssd.testing.processes import speculators

from .pair import greedy, humaneval_ids
from .same_output import report_divergences

pytestmark = pytest.mark.integration

# Sized for CI on a 2-core AVX2-only CPU, where an SSD verify of 5 tokens takes about 2 s (it
# was 3 prompts × 32 and × 64). SSD_TOKENS is 32, not 16: on the AMX Xeon, where the bf16
# target verifies about as fast as the int8 draft builds (T_p 1.1-1.2), the chat prompt's
# accept length is 1.8-2.3 from run to run (its misses drafted by n-grams accept nothing), and
# at 16 tokens the mean of the two fell to 1.8 and 1.89 in two CI runs against the bar of 2;
# at 32: 2.17, 2.03, 2.37.
PROMPTS = 2
TRANSFORMERS_PROMPTS = 1  # transformers' bf16 generate alone takes ~1.5 min per prompt there
AR_TOKENS = 16
SSD_TOKENS = 32
# Chat-templated prompt sets: CI's smoke has one code and one chat prompt; the rest is `real`.
PROMPT_SETS = [
    pytest.param(BOTH, id="code-and-chat"),
    pytest.param(HUMANEVAL, id="humaneval", marks=pytest.mark.real),
]


@pytest.fixture(scope="module", params=PROMPT_SETS)
def prompts(pair, request: pytest.FixtureRequest) -> list[list[int]]:
    tokenizer = load_tokenizer(pair[0])
    return [list(p.input_ids) for p in load_prompts(request.param, tokenizer, PROMPTS)]


@pytest.fixture(scope="module")
def transformers_prompts(pair) -> list[list[int]]:
    return humaneval_ids(pair[0], TRANSFORMERS_PROMPTS)


@pytest.fixture(scope="module")
def transformers_greedy(pair, transformers_prompts) -> list[list[int]]:
    """transformers' greedy `AR_TOKENS` tokens from the bf16 folder, in a child process (the
    model's memory must not stay in the test process beside the servers)."""
    return in_child(generate_greedy, str(pair[0]), transformers_prompts, AR_TOKENS)


@pytest.mark.real
def test_ar_server_matches_transformers_greedy(
    pair, transformers_prompts, transformers_greedy, ar_server
):
    compared = transformers_prompts
    got = [r["output_ids"] for r in greedy(ar_server, compared, AR_TOKENS)]
    check = check_greedy(pair[0], compared, transformers_greedy, got)
    report_divergences("AR vs transformers", check)
    assert not check.violations, check.violations


def test_ssd_greedy_matches_ar_and_speculates(pair, prompts, ar_server, ssd_server):
    expected = [r["output_ids"] for r in greedy(ar_server, prompts, SSD_TOKENS)]
    results = greedy(ssd_server, prompts, SSD_TOKENS)
    stats = requests.get(f"{ssd_server.url}/ssd/stats", timeout=60).json()
    found = speculators(ssd_server.proc.pid)
    assert len(found) == 1, "the speculator must be its own process"
    scheduler = found[0].target
    target_cpus = set(os.sched_getaffinity(scheduler.pid))
    draft_cpus = set(os.sched_getaffinity(found[0].process.pid))
    got = [r["output_ids"] for r in results]
    check = check_greedy(pair[0], prompts, expected, got, continue_ar=continuation(ar_server.url))
    report_divergences("SSD vs AR", check)
    assert not check.violations, check.violations
    assert check.checked == check.total
    assert target_cpus and draft_cpus and not target_cpus & draft_cpus
    accept_length = sum(r["meta_info"]["spec_accept_length"] for r in results) / len(results)
    assert accept_length > 2, accept_length
    assert stats["cache_hit_rate"] > 0, stats

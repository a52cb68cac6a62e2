"""The real pair on the int8 target (`--quantization ssd_int8`, marked `real`: `make test-real`).

Its own two servers, started one after the other so the second reads the int8 cache the first
wrote beside the checkpoint: the target alone in int8, then SSD on it with the launcher's
defaults. Greedy SSD must reproduce the int8 AR server under docs/design.md#the-greedy-rule rule (a
divergence
only where the fp32 top-2 margin, of the bf16 checkpoint, is below ε; teacher-forced on after
one), and it must speculate (accept length > 2).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from real_pair.pair import greedy
from real_pair.same_output import report_divergences

from eval.datasets import HUMANEVAL, load_prompts, load_tokenizer
from eval.lossless import continuation
from eval.servers import Server, started_together
from sglang_ssd.target import METHOD
from sglang_ssd.testing import check_greedy

pytestmark = [pytest.mark.integration, pytest.mark.real]

PROMPTS = 2
TOKENS = 32


@pytest.fixture(scope="module")
def int8_servers(pair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """ "ar" (int8, started first: it quantises or reads the cache) then "ssd" (int8)."""
    logs = tmp_path_factory.mktemp("int8-real-logs")
    target, draft = (str(path) for path in pair)
    common = ["--model-path", target, "--quantization", METHOD]
    ar = [*common, "--speculative-algorithm", "NONE", "--disable-overlap-schedule"]
    ssd = [*common, "--speculative-draft-model-path", draft, "--speculative-algorithm", "SSD"]
    # async: the near-tie rule reads the bf16 checkpoint's margins, which say nothing of the int8
    # target's own, and the other arrangements change the verify's thread count.
    ssd += ["--ssd-speculator-timeout", "300", "--ssd-mode", "async"]
    made = {
        "ar": Server("int8-ar", ar, log_path=logs / "ar.log"),
        "ssd": Server("int8-ssd", ssd, log_path=logs / "ssd.log"),
    }
    with started_together({"ar": made["ar"]}), started_together({"ssd": made["ssd"]}):
        yield made


def test_int8_ssd_greedy_matches_int8_ar_and_speculates(pair, int8_servers):
    tokenizer = load_tokenizer(pair[0])
    prompts = [list(p.input_ids) for p in load_prompts(HUMANEVAL, tokenizer, PROMPTS)]
    ar, ssd = int8_servers["ar"], int8_servers["ssd"]
    expected = [r["output_ids"] for r in greedy(ar, prompts, TOKENS)]
    results = greedy(ssd, prompts, TOKENS)
    got = [r["output_ids"] for r in results]
    check = check_greedy(pair[0], prompts, expected, got, continue_ar=continuation(ar.url))
    report_divergences("int8 SSD vs int8 AR", check)
    assert not check.violations, check.violations
    assert check.checked == check.total
    accept_length = sum(r["meta_info"]["spec_accept_length"] for r in results) / len(results)
    assert accept_length > 2, accept_length
    ssd_log = ssd.log_path.read_text(errors="replace")
    assert "int8 target: loading cached layers" in ssd_log  # the AR server's cache

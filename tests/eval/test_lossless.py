"""eval.lossless: rows carry every divergence and the SSD cache hit rate; AR continues."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from eval import lossless
from eval.client import META_KEYS, RequestResult
from eval.datasets import Prompt, Record
from sglang_ssd.testing.greedy import Divergence, GreedyCheck, PromptCheck


def test_ssd_meta_info_is_kept() -> None:
    assert {"ssd_cache_hit_rate", "ssd_rounds"} <= set(META_KEYS)


def test_rows_and_summary() -> None:
    prompts = [Prompt(Record("humaneval", f"HumanEval/{i}", "x"), (1, 2)) for i in range(2)]
    ar = [RequestResult(p.id, 0.0, 2.0, completion_tokens=4) for p in prompts]
    ssd = [
        RequestResult(
            p.id,
            0.0,
            1.0,
            completion_tokens=4,
            meta_info={"ssd_cache_hit_rate": 0.75, "ssd_rounds": 4},
        )
        for p in prompts
    ]
    checks = (
        PromptCheck((), 4, 4),
        PromptCheck((Divergence(1, 5, 6, 0.01), Divergence(3, 7, 8, 0.9)), 4, 4),
    )
    check = GreedyCheck(checks, ("prompt 1: token 3 ...",), eps=0.2)
    rows = lossless._rows(prompts, ar, ssd, checks)
    assert rows[0]["identical"] and rows[0]["ssd_cache_hit_rate"] == 0.75
    assert [d["index"] for d in rows[1]["divergences"]] == [1, 3]
    assert rows[1]["checked"] == rows[1]["tokens"] == 4
    summary = lossless._summary(check, rows)
    assert summary["identical"] == 1 and not summary["passed"]
    assert (summary["divergences"], summary["allowed_divergences"]) == (2, 1)
    assert (summary["checked_tokens"], summary["total_tokens"]) == (8, 8)


def test_continuation_asks_the_server_for_greedy_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[Sequence[int], Any]] = []

    def fake_generate(url: str, pid: str, ids: Sequence[int], sampling: Any) -> RequestResult:
        sent.append((list(ids), sampling))
        return RequestResult(pid, 0.0, 1.0, output_ids=[9] * sampling.max_new_tokens)

    monkeypatch.setattr(lossless, "generate", fake_generate)
    assert lossless.continuation("http://x")([1, 2, 3], 2) == [9, 9]
    assert sent[0][0] == [1, 2, 3] and sent[0][1].greedy and sent[0][1].max_new_tokens == 2
    monkeypatch.setattr(
        lossless, "generate", lambda *a: RequestResult("c", 0.0, 1.0, error="HTTP 500")
    )
    with pytest.raises(RuntimeError, match="HTTP 500"):
        lossless.continuation("http://x")([1], 1)

"""SSD's `/generate` responses against AR's, under docs/design.md#the-greedy-rule greedy rule (test
helper)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglang_ssd.testing import check_greedy
from sglang_ssd.testing.greedy import GreedyCheck


def _fields(response: dict[str, Any]) -> tuple[Any, ...]:
    meta = response["meta_info"]
    return response["text"], meta["finish_reason"], meta["completion_tokens"]


def report_divergences(label: str, check: GreedyCheck) -> None:
    """Print each allowed divergence of `check` with its fp32 top-2 margin."""
    for i, item in enumerate(check.prompts):
        for d in item.divergences:
            print(
                f"{label}: item {i} allowed divergence at token {d.index} (margin {d.margin:.3f})"
            )


def assert_greedy_same(
    model_dir: Path,
    prompts: Sequence[Sequence[int]],
    expected: Sequence[dict[str, Any]],
    got: Sequence[dict[str, Any]],
) -> None:
    """Each `got` response equals its `expected` one: output ids, text, `finish_reason` (type and
    matched) and `completion_tokens`; or, where the output ids differ, every divergence is at a
    position whose fp32 top-2 margin is below ε (`check_greedy`; printed), and the other fields
    are not compared (the texts differ by construction).

    Raises:
        AssertionError: naming the item and what differs.
    """
    check = check_greedy(
        model_dir, prompts, [e["output_ids"] for e in expected], [g["output_ids"] for g in got]
    )
    report_divergences("SSD vs AR", check)
    assert not check.violations, check.violations
    for i, (item, e, g) in enumerate(zip(check.prompts, expected, got, strict=True)):
        if item.identical:
            assert _fields(g) == _fields(e), (i, _fields(e), _fields(g))

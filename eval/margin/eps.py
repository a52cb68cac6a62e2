"""ε from the measured positions: 1.5 × the largest fp32 top-2 margin where the decode and the
verify argmax differ, else 1.5 × the largest decode-vs-verify change of the top-2 gap."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eval.margin.chains import Chain, all_differing
from sglang_ssd.testing.greedy import fp32_top2_margins

FACTOR = 1.5
Margins = Callable[[Path, list[list[int]]], list[float]]


def fill_fp32_margins(chains: Sequence[Chain], target: Path, margins: Margins | None = None) -> int:
    """Add `fp32_margin` (logit units, the target in fp32 on the teacher-forced context) to
    every differing position that lacks it; returns how many were computed."""
    todo = [(c, d) for c, d in all_differing(chains) if d.get("fp32_margin") is None]
    if not todo:
        return 0
    values = (margins or fp32_top2_margins)(target, [c.context(d["index"]) for c, d in todo])
    for (_, d), m in zip(todo, values, strict=True):
        d["fp32_margin"] = m
    return len(todo)


def _largest_gap_change(chains: Sequence[Chain]) -> dict[str, Any] | None:
    best: dict[str, Any] | None = None
    for c in chains:
        for s in c.segments:
            for k, (d, v) in enumerate(zip(s["decode_gap"], s["verify_gap"], strict=True)):
                if best is None or abs(d - v) > best["change"]:
                    best = {"id": c.prompt.id, "index": s["start"] + k + 1,
                            "decode_gap": d, "verify_gap": v, "change": abs(d - v)}  # fmt: skip
    return best


def summarize(chains: Sequence[Chain], min_positions: int) -> dict[str, Any]:
    """ε and the numbers behind it (differing positions need their `fp32_margin` first).

    Returns a JSON-ready dict: positions (all, lossless prompts'), the differing positions
    with their margins, the largest gap change, ε and which rule gave it, and whether
    `min_positions` were reached.
    """
    differing = [{"id": c.prompt.id, "dataset": c.prompt.record.dataset, **d}
                 for c, d in all_differing(chains)]  # fmt: skip
    change = _largest_gap_change(chains)
    if differing:
        worst = max(d["fp32_margin"] for d in differing)
        eps, rule = FACTOR * worst, f"{FACTOR} x max fp32 top-2 margin at differing positions"
    else:
        worst = None
        eps = FACTOR * change["change"] if change else None
        rule = f"{FACTOR} x max decode-vs-verify change of the top-2 gap (no argmax differed)"
    positions = sum(c.positions for c in chains)
    return {
        "eps": eps,
        "eps_rule": rule,
        "max_fp32_margin_at_differing": worst,
        "positions": positions,
        "positions_lossless_prompts": sum(c.positions for c in chains if c.lossless),
        "min_positions": min_positions,
        "complete": positions >= min_positions,
        "differing_count": len(differing),
        "differing": sorted(differing, key=lambda d: -d["fp32_margin"]),
        "largest_gap_change": change,
        "prompts_started": sum(1 for c in chains if c.segments),
        "tie_orders": sum(c.tie_orders for c in chains),
    }

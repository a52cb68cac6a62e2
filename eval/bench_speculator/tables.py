"""The results of `eval.bench_speculator`: medians over clean samples, T_p, printed tables."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from eval.bench_speculator.timing import CLEAN_FOREIGN_CORES


def clean_median(seconds: Sequence[float], foreign: Sequence[float]) -> tuple[float, int]:
    """(median, n) over the clean samples when there are at least 3, else over all."""
    clean = [s for s, f in zip(seconds, foreign, strict=True) if f <= CLEAN_FOREIGN_CORES]
    use = clean if len(clean) >= 3 else list(seconds)
    return (statistics.median(use) if use else float("nan")), len(clean)


def summarize(draft: dict[str, Any], target: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (b, D, B): median build, verify and JIT times (over clean samples, see
    `clean_median`), T_p = build / verify, how many samples were clean, and the minima (the
    least disturbed samples: T_p_min = min build / min verify)."""
    verify = {v["batch"]: clean_median(v["seconds"], v["foreign"]) for v in target}
    jit = {j["batch"]: clean_median(j["seconds"], j["foreign"]) for j in draft["jit"]}
    verify_min = {v["batch"]: min(v["seconds"]) for v in target}
    rows = []
    for p in draft["builds"]:
        b = p["batch"]
        build, clean = clean_median(p["seconds"], p["foreign"])
        rows.append(
            {
                "batch": b,
                "depth": p["depth"],
                "budget": p["budget"],
                "fanout": p["fanout"],
                "build_s": build,
                "verify_s": verify[b][0],
                "T_p": build / verify[b][0],
                "jit_s": jit[b][0],
                "jit_over_verify": jit[b][0] / verify[b][0],
                "build_min_s": min(p["seconds"]),
                "T_p_min": min(p["seconds"]) / verify_min[b],
                "samples": len(p["seconds"]),
                "clean_samples": clean,
                "verify_samples": len(target[0]["seconds"]),
                "verify_clean_samples": verify[b][1],
                "jit_clean_samples": jit[b][1],
                "mean_prefix_len": statistics.mean(p["prefix_len"]),
                "phases_s": median_phases(p.get("phases", [])),
            }
        )
    return sorted(rows, key=lambda r: (r["batch"], r["depth"], r["budget"]))


def median_phases(samples: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per phase, the median seconds over the builds (a phase missing from a build counts 0)."""
    names = sorted({name for sample in samples for name in sample})
    return {n: statistics.median(s.get(n, 0.0) for s in samples) for n in names}


def format_table(rows: Sequence[dict[str, Any]], minima: bool = False) -> str:
    """Per b: verify and JIT times, then build ms (T_p) for each D (rows) and B (columns);
    `minima` shows the minimum build time and T_p_min instead of the medians."""
    build_key, tp_key = ("build_min_s", "T_p_min") if minima else ("build_s", "T_p")
    lines = []
    for b in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == b]
        budgets = sorted({r["budget"] for r in mine})
        first = mine[0]
        lines.append(
            f"b={b}: verify(γ+1) {first['verify_s'] * 1e3:.0f} ms, JIT draft (γ forwards) "
            f"{first['jit_s'] * 1e3:.0f} ms = {first['jit_over_verify']:.2f} verify"
        )
        lines.append("  D \\ B " + "".join(f"{budget:>15}" for budget in budgets))
        for depth in sorted({r["depth"] for r in mine}):
            cells = {r["budget"]: r for r in mine if r["depth"] == depth}
            lines.append(
                f"  {depth:>5} "
                + "".join(
                    f"{cells[f][build_key] * 1e3:>7.0f} ({cells[f][tp_key]:.2f})"
                    + ("*" if cells[f]["clean_samples"] < 3 and not minima else " ")
                    for f in budgets
                )
            )
    if minima:
        lines.append("build ms (T_p = build / verify), minima over all samples")
    else:
        lines.append(
            "build ms (T_p = build / verify), medians over clean samples; * = fewer than 3 clean"
            " (median of all)"
        )
    return "\n".join(lines)

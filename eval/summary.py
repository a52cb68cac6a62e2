"""Numbers derived from a results dict: throughput, accept length, ratios, output identity.

Definitions (docs/design.md#accept-length-and-alpha):
- tok/s of a configuration = completion tokens / wall time of its batches (for b = 1 that is
  tokens over summed request latencies, prefill included).
- accept length L = completion tokens / `spec_verify_ct` (SGLang's `spec_accept_length`; it counts
  the token that prefill emits, so it is slightly above the per-round value
  ``1 + spec_num_correct_drafts / spec_verify_ct``, also reported as `accept_length_rounds`).
- acceptance rate = (L − 1) / γ.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eval import ssd_stats


def _requests(results: Mapping[str, Any], config: str) -> list[dict[str, Any]]:
    out = []
    for batch in results["batches"]:
        if batch["config"] == config:
            for r in batch["requests"]:
                out.append(r | {"repeat": batch["repeat"], "unit": batch["unit"]})
    return out


def _median(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def _geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def config_summary(results: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Throughput, latency and speculative statistics of one configuration."""
    name = config["name"]
    batches = [b for b in results["batches"] if b["config"] == name]
    reqs = _requests(results, name)
    tokens = sum(r["completion_tokens"] for r in reqs)
    wall = sum(b["wall_s"] for b in batches)
    per_repeat: dict[int, list[float]] = {}
    for b in batches:
        per_repeat.setdefault(b["repeat"], [0, 0.0])
        per_repeat[b["repeat"]][0] += b["tokens"]
        per_repeat[b["repeat"]][1] += b["wall_s"]
    out: dict[str, Any] = {
        "requests": len(reqs),
        "completion_tokens": tokens,
        "wall_s": wall,
        "tok_per_s": tokens / wall if wall > 0 else None,
        "tok_per_s_per_repeat": [t / w if w > 0 else None for t, w in per_repeat.values()],
        "request_tok_per_s_mean": statistics.fmean(r["tok_per_s"] for r in reqs) if reqs else None,
        "request_tok_per_s_median": _median(r["tok_per_s"] for r in reqs),
        "latency_s_median": _median(r["latency_s"] for r in reqs),
        "ttft_s_median": _median(r["ttft_s"] for r in reqs if r.get("ttft_s") is not None),
        "finish_reasons": dict(Counter(_reason(r["finish_reason"]) for r in reqs)),
        "cached_tokens": sum(r["meta_info"].get("cached_tokens", 0) for r in reqs),
        # Average number of CPUs other processes kept busy while this config was measured.
        "foreign_cpus": (
            sum(b.get("foreign_cpu_s", 0.0) for b in batches) / wall if wall > 0 else None
        ),
    }
    out.update(_spec_summary(reqs, config.get("lookahead")))
    ssd = [b["ssd"] for b in batches if b.get("ssd")]
    if ssd:  # SSD's per-round counters: hit rate, accept length on hits/misses, T_v, T_p, T_b
        out["ssd"] = ssd_stats.measured(ssd_stats.add(ssd), wall)
    return out


def _reason(reason: Any) -> str:
    return reason.get("type", str(reason)) if isinstance(reason, dict) else str(reason)


def _spec_summary(reqs: Sequence[Mapping[str, Any]], lookahead: int | None) -> dict[str, Any]:
    spec = [r for r in reqs if r["meta_info"].get("spec_verify_ct")]
    if not spec:
        return {"accept_length": None, "acceptance_rate": None, "spec_verify_ct": 0}
    verify = sum(r["meta_info"]["spec_verify_ct"] for r in spec)
    tokens = sum(r["completion_tokens"] for r in spec)
    length = tokens / verify
    out: dict[str, Any] = {
        "spec_verify_ct": verify,
        "accept_length": length,
        "acceptance_rate": (length - 1) / lookahead if lookahead else None,
        "spec_requests": len(spec),
    }
    if all("spec_num_correct_drafts" in r["meta_info"] for r in spec):
        correct = sum(r["meta_info"]["spec_num_correct_drafts"] for r in spec)
        proposed = sum(r["meta_info"].get("spec_num_proposed_drafts", 0) for r in spec)
        out["accept_length_rounds"] = 1 + correct / verify
        out["acceptance_rate_rounds"] = correct / verify / lookahead if lookahead else None
        out["sglang_accept_rate"] = correct / proposed if proposed else None
    return out


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(results: Mapping[str, Any], ref: str, other: str) -> dict[str, Any]:
    """`other` against `ref`: throughput ratio, paired per-request ratios, identical outputs."""
    key = lambda r: (r["repeat"], r["prompt_id"])  # noqa: E731
    ref_reqs = {key(r): r for r in _requests(results, ref)}
    pairs = [(ref_reqs[key(r)], r) for r in _requests(results, other) if key(r) in ref_reqs]
    ratios = [o["tok_per_s"] / a["tok_per_s"] for a, o in pairs if a["tok_per_s"] > 0]
    mismatches = []
    for a, o in pairs:
        pos = _first_difference(a["output_ids"], o["output_ids"])
        if pos is not None:
            mismatches.append(
                {"repeat": a["repeat"], "prompt_id": a["prompt_id"], "first_difference": pos}
            )
    return {
        "reference": ref,
        "config": other,
        "pairs": len(pairs),
        "paired_ratio_median": _median(ratios),
        "paired_ratio_geomean": _geomean(ratios),
        "identical_outputs": len(pairs) - len(mismatches),
        "mismatches": mismatches,
    }


def repeat_consistency(results: Mapping[str, Any], config: str) -> dict[str, Any]:
    """Do repeats of the same prompt on the same configuration give the same tokens?"""
    by_prompt: dict[str, set[tuple[int, ...]]] = {}
    for r in _requests(results, config):
        by_prompt.setdefault(r["prompt_id"], set()).add(tuple(r["output_ids"]))
    varying = sorted(p for p, outs in by_prompt.items() if len(outs) > 1)
    return {"prompts": len(by_prompt), "varying": varying}


def summarize(results: Mapping[str, Any]) -> dict[str, Any]:
    """Per-configuration summaries plus comparisons against the first configuration."""
    configs = results["configs"]
    per_config = {c["name"]: config_summary(results, c) for c in configs}
    ref = configs[0]["name"]
    comparisons = {}
    for c in configs[1:]:
        cmp = compare(results, ref, c["name"])
        a, b = per_config[ref]["tok_per_s"], per_config[c["name"]]["tok_per_s"]
        cmp["tok_per_s_ratio"] = b / a if a and b else None
        comparisons[c["name"]] = cmp
    consistency = {c["name"]: repeat_consistency(results, c["name"]) for c in configs}
    return {"configs": per_config, "vs_reference": comparisons, "repeat_consistency": consistency}


def format_table(results: Mapping[str, Any]) -> str:
    """A plain-text table: tok/s, ratio to the reference (aggregate and median of per-prompt
    ratios), L, (L−1)/γ, identical outputs, and the CPUs other processes used meanwhile."""
    summary = results.get("summary") or summarize(results)
    ref = results["configs"][0]["name"]
    header = ("config", "tok/s", "ratio", "paired", "L", "(L-1)/γ", "L_rounds", "hit rate",
              "identical", "other CPUs")  # fmt: skip
    rows = [header]
    for c in results["configs"]:
        s = summary["configs"][c["name"]]
        cmp = summary["vs_reference"].get(c["name"])
        rows.append(
            (
                c["name"],
                _fmt(s["tok_per_s"]),
                "1.00 (ref)" if c["name"] == ref else _fmt(cmp["tok_per_s_ratio"]),
                "" if cmp is None else _fmt(cmp["paired_ratio_median"]),
                _fmt(s["accept_length"]),
                _fmt(s["acceptance_rate"]),
                _fmt(s.get("accept_length_rounds")),
                _fmt((s.get("ssd") or {}).get("p_hit")),
                "ref" if cmp is None else f"{cmp['identical_outputs']}/{cmp['pairs']}",
                _fmt(s.get("foreign_cpus")),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=False)).rstrip() for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"

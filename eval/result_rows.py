"""The numbers behind the figures and the report's tables, read from results JSON files.

Each function turns one or more results files (`eval.harness`, `eval.sweep`, `eval.ssd_bench`,
`eval.trace` replays) into plain rows; `eval.figures` draws them and `eval.report` tabulates
them, so a figure and its table never disagree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eval import ssd_stats
from eval.configs import Config
from eval.results_io import read_results
from eval.summary import summarize
from eval.sweep import results_name

TRACE_REPLAY = "trace-replay.json"


def load(path: Path) -> dict[str, Any] | None:
    """A results file, or None when it is missing, unreadable or has no batches."""
    try:
        results = read_results(path)
    except (OSError, ValueError):
        return None
    return results if results.get("batches") else None


def results_file(results_dir: Path, stem: str, quick: bool) -> tuple[Path, dict[str, Any] | None]:
    """An experiment's results file (`results_name`) and its contents (see `load`)."""
    path = results_dir / f"{results_name(stem, quick)}.json"
    return path, load(path)


def summary_of(results: Mapping[str, Any]) -> dict[str, Any]:
    """Per-configuration summaries (recomputed for an unfinished run)."""
    return (results.get("summary") or summarize(results))["configs"]


def reference(results: Mapping[str, Any]) -> str | None:
    """The first autoregressive configuration (the speedup baseline), if any."""
    return next((c["name"] for c in results["configs"] if c.get("algorithm") == "NONE"), None)


def speedup_rows(results: Mapping[str, Any], source: str = "") -> list[dict[str, Any]]:
    """Every speculative configuration against the AR reference of the same file: measured
    speedup, and for SSD the speedup model's prediction from its own counters. A file with
    ``ssd_comparisons`` (`eval.ssd_bench`) pairs each configuration with the AR of its own
    arrangement: those rows are used instead."""
    batch = results["settings"]["batch_size"]
    algorithms = {c["name"]: c.get("algorithm") for c in results["configs"]}
    if results.get("ssd_comparisons"):
        return [
            {
                "source": source,
                "config": r["config"],
                "baseline": r["baseline"],
                "batch_size": batch,
                "speedup": r["speedup"],
                "predicted": r.get("predicted"),
            }
            for r in results["ssd_comparisons"]
            if algorithms.get(r["baseline"]) == "NONE" and r.get("speedup")
        ]
    ref = reference(results)
    summary = summary_of(results)
    if ref is None or not summary[ref]["tok_per_s"]:
        return []
    ar = summary[ref]["tok_per_s"]
    rows = []
    for c in results["configs"]:
        s = summary[c["name"]]
        if c["name"] == ref or not s["tok_per_s"]:
            continue
        m = s.get("ssd")
        predicted = None
        if m and c.get("lookahead"):
            predicted = ssd_stats.predict(
                m, c["lookahead"], batch, ar, async_mode=Config.from_dict(c).ssd_mode != "sync"
            )
        rows.append(
            {
                "source": source,
                "config": c["name"],
                "baseline": ref,
                "batch_size": batch,
                "speedup": s["tok_per_s"] / ar,
                "predicted": predicted,
            }
        )
    return rows


def main_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The main table: tok/s, speedup over AR, accept length, acceptance, hit rate, identity."""
    summary = results.get("summary") or summarize(results)
    per = summary["configs"]
    ref = reference(results)
    ar = per[ref]["tok_per_s"] if ref else None
    rows = []
    for c in results["configs"]:
        s = per[c["name"]]
        cmp = summary["vs_reference"].get(c["name"])
        rows.append(
            {
                "config": c["name"],
                "tok_per_s": s["tok_per_s"],
                "speedup": s["tok_per_s"] / ar if ar and s["tok_per_s"] else None,
                "accept_length": s.get("accept_length"),
                "acceptance_rate": s.get("acceptance_rate"),
                "hit_rate": (s.get("ssd") or {}).get("p_hit"),
                "identical": None if cmp is None else f"{cmp['identical_outputs']}/{cmp['pairs']}",
                "notes": c.get("notes", ""),
            }
        )
    return rows


def dataset_rows(results: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """tok/s per configuration per prompt set: tokens over summed request latencies."""
    sets = {p["id"]: p["dataset"] for p in results["prompts"]}
    sums: dict[str, dict[str, list[float]]] = {}
    for batch in results["batches"]:
        for r in batch["requests"]:
            acc = sums.setdefault(batch["config"], {}).setdefault(sets[r["prompt_id"]], [0, 0])
            acc[0] += r["completion_tokens"]
            acc[1] += r["latency_s"]
    order = [c["name"] for c in results["configs"] if c["name"] in sums]
    return {c: {d: t / s for d, (t, s) in sums[c].items() if s > 0} for c in order}


def _sweep_rows(
    results: Mapping[str, Any], settings: Mapping[str, str], stats: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per sweep point (a configuration with runtime `admin` settings): its name, the
    `settings` (row key -> admin key) and the summary `stats` (``hit_rate`` is SSD's p_hit)."""
    summary = summary_of(results)
    rows = []
    for c in results["configs"]:
        if not c.get("admin"):
            continue
        s = summary[c["name"]]
        row = {"config": c["name"], **{k: c["admin"][a] for k, a in settings.items()}}
        for stat in stats:
            row[stat] = (s.get("ssd") or {}).get("p_hit") if stat == "hit_rate" else s.get(stat)
        rows.append(row)
    return rows


def beta_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per β point: hit rate, accept length, acceptance (L − 1)/γ and tok/s."""
    stats = ("hit_rate", "accept_length", "acceptance_rate", "tok_per_s")
    rows = _sweep_rows(results, {"beta": "beta"}, stats)
    return sorted(rows, key=lambda r: -r["beta"])


def fanout_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per live fan-out point: shape, budget, hit rate, accept length, tok/s."""
    settings = {"fanout": "fanout", "budget": "fanout_budget"}
    return _sweep_rows(results, settings, ("hit_rate", "accept_length", "tok_per_s"))


def trace_rows(path: Path) -> tuple[int | None, list[dict[str, Any]]]:
    """The trace replay's rows at its deepest tree depth (D = γ, the deepest a server builds), as
    (depth, rows); (None, []) when the file is missing or unreadable."""
    try:
        rows = json.loads(Path(path).read_text())["results"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, []
    depth = max((r["depth"] for r in rows if r.get("depth") is not None), default=None)
    return depth, [r for r in rows if depth is None or r.get("depth") == depth]


def backup_files(results_dir: Path, quick: bool) -> dict[int, Path]:
    """``sweep-backup-b<b>[-quick].json`` files by batch size b."""
    pattern = re.compile(rf"sweep-backup-b(\d+){'-quick' if quick else ''}\.json")
    found = {}
    for path in sorted(Path(results_dir).glob("sweep-backup-b*.json")):
        match = pattern.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def backup_rows(results_by_batch: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per batch size and configuration: tok/s, median request latency, hit rate, and b* as
    the server's miss policy reported it after the configuration's last batch."""
    rows = []
    for batch, results in results_by_batch.items():
        summary = summary_of(results)
        for c in results["configs"]:
            s = summary[c["name"]]
            last = [b for b in results["batches"] if b["config"] == c["name"] and "fallback" in b]
            fb = last[-1]["fallback"] if last else {}
            rows.append(
                {
                    "batch_size": batch,
                    "config": c["name"],
                    "backup": (c.get("admin") or {}).get("backup"),
                    "tok_per_s": s["tok_per_s"],
                    "latency_s_median": s.get("latency_s_median"),
                    "hit_rate": (s.get("ssd") or {}).get("p_hit"),
                    "b_star": fb.get("auto_batch_threshold"),
                    "has_fallback": bool(fb) and "error" not in fb,
                }
            )
    return rows


def policy_b_star(rows: Sequence[Mapping[str, Any]]) -> tuple[bool, int | None]:
    """(known, b*) from the last SSD batch at the largest batch size (the most measurements)."""
    reported = [r for r in rows if r["has_fallback"]]
    if not reported:
        return False, None
    last = max(reported, key=lambda r: r["batch_size"])
    return True, last["b_star"]


def prediction_sources(results_dir: Path, quick: bool) -> list[Path]:
    """Files whose SSD rows carry the model's prediction: main, β and backup sweeps, benches."""
    names = [results_name(s, quick) + ".json" for s in ("paper-main", "sweep-beta")]
    paths = [results_dir / n for n in names]
    paths += list(backup_files(results_dir, quick).values())
    bench = re.compile(rf"ssd-bench-\w+-b\d+-[\w.]+{'-quick' if quick else ''}\.json")
    paths += [p for p in sorted(results_dir.glob("ssd-bench-*.json")) if bench.fullmatch(p.name)]
    return [p for p in paths if p.exists()]


def prediction_rows(results_dir: Path, quick: bool) -> list[dict[str, Any]]:
    """`speedup_rows` with a prediction, from every file of `prediction_sources`."""
    rows = []
    for path in prediction_sources(results_dir, quick):
        results = load(path)
        if results is not None:
            rows += [r for r in speedup_rows(results, path.name) if r["predicted"] is not None]
    return rows

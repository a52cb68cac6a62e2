"""PNG figures of the paper's experiments, drawn from results JSON files (`eval.sweep`).

Each figure function takes the results folder and the output folder and returns a `Figure`
(the PNG and the JSON files behind it), or None with a logged reason when its inputs are
missing. The data behind the figures (`main_rows`, `beta_rows`, ...) is public: the report's
tables use the same numbers. Matplotlib's object API with the Agg canvas: no pyplot, no display.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure as MplFigure

from eval import ssd_stats
from eval.configs import Config
from eval.summary import summarize
from eval.sweep import results_name

logger = logging.getLogger(__name__)

TRACE_REPLAY = "trace-replay.json"


@dataclass
class Figure:
    """One drawn figure: its PNG and the results files it was drawn from."""

    key: str
    title: str
    png: Path
    sources: list[Path]
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- reading results
def load(path: Path) -> dict[str, Any] | None:
    """A results file, or None when it is missing, unreadable or has no batches."""
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return results if results.get("batches") else None


def _results(results_dir: Path, stem: str, quick: bool) -> tuple[Path, dict[str, Any] | None]:
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
    """The trace replay's rows at its deepest tree depth (the server's default, D = γ), as
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


# ---------------------------------------------------------------- drawing
def _save(fig: MplFigure, out_dir: Path, key: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{key}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _log2_axis(ax: Any, values: Sequence[float]) -> None:
    """A base-2 log x axis labelled with the plotted values themselves (1, 2, 4, not 2^k)."""
    ticks = sorted(set(values))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{v:g}" for v in ticks])
    ax.minorticks_off()


def _skip(key: str, reason: str) -> None:
    logger.info("figure %s skipped: %s", key, reason)


def fig_datasets(results_dir: Path, out_dir: Path, quick: bool) -> Figure | None:
    """Grouped bars: tok/s of each configuration per prompt set."""
    key = "tok_per_s_by_dataset"
    path, results = _results(results_dir, "paper-main", quick)
    if results is None:
        return _skip(key, f"{path} missing")
    rows = dataset_rows(results)
    sets = sorted({d for per in rows.values() for d in per})
    fig = MplFigure(figsize=(7, 4))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(rows))
    for i, (config, per) in enumerate(rows.items()):
        xs = [j + i * width for j in range(len(sets))]
        ax.bar(xs, [per.get(d, 0.0) for d in sets], width, label=config)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))], sets)
    ax.set_ylabel("tokens / s")
    ax.set_title("Throughput per prompt set (batch 1, greedy)")
    ax.legend(fontsize=8)
    return Figure(key, "tok/s per dataset", _save(fig, out_dir, key), [path])


def fig_speedup_vs_batch(results_dir: Path, out_dir: Path, quick: bool) -> Figure | None:
    """Speedup over AR vs batch size, per SSD configuration (backup sweep, SSD benchmarks)."""
    key = "speedup_vs_batch"
    files = backup_files(results_dir, quick)
    bench = re.compile(rf"ssd-bench-\w+-b(\d+)-greedy{'-quick' if quick else ''}\.json")
    bench_files = [
        p for p in sorted(results_dir.glob("ssd-bench-*.json")) if bench.fullmatch(p.name)
    ]
    files_set = set(files.values())
    lines: dict[str, dict[int, float]] = {}
    sources = []
    for path in [*files.values(), *bench_files]:
        results = load(path)
        if results is None:
            continue
        sources.append(path)
        for row in speedup_rows(results):
            if not row["config"].startswith("SSD") and path not in files_set:
                continue  # from the benchmarks, SSD's rows only
            label = row["config"]
            if path not in files_set:  # the same SSD against each arrangement's AR
                label += f" vs {row['baseline']} (ssd bench)"
            lines.setdefault(label, {})[row["batch_size"]] = row["speedup"]
    if not lines:
        return _skip(key, "no sweep-backup-b*.json or ssd-bench-*-greedy.json results")
    fig = MplFigure(figsize=(6, 4))
    ax = fig.add_subplot()
    for name, points in lines.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    _log2_axis(ax, [x for points in lines.values() for x in points])
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over AR (tok/s ratio)")
    ax.set_title("Speedup vs batch size (greedy)")
    ax.legend(fontsize=8)
    return Figure(key, "speedup vs batch size", _save(fig, out_dir, key), sources)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points (tok/s, latency) not dominated by one with more tok/s and less latency."""
    front = []
    for x, y in sorted(points, key=lambda p: (-p[0], p[1])):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return sorted(front)


def fig_pareto(results_dir: Path, out_dir: Path, quick: bool) -> Figure | None:
    """Median request latency vs tok/s, one line per configuration through its batch sizes."""
    key = "latency_throughput_pareto"
    files = backup_files(results_dir, quick)
    loaded = {b: r for b, p in files.items() if (r := load(p)) is not None}
    if not loaded:
        return _skip(key, "no sweep-backup-b*.json results")
    rows = [r for r in backup_rows(loaded) if r["tok_per_s"] and r["latency_s_median"]]
    fig = MplFigure(figsize=(6.5, 4.5))
    ax = fig.add_subplot()
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = sorted((r for r in rows if r["config"] == config), key=lambda r: r["batch_size"])
        xs, ys = [r["tok_per_s"] for r in mine], [r["latency_s_median"] for r in mine]
        ax.plot(xs, ys, marker="o", label=config)
        for r in mine:
            ax.annotate(f"b={r['batch_size']}", (r["tok_per_s"], r["latency_s_median"]),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")  # fmt: skip
    front = pareto_front([(r["tok_per_s"], r["latency_s_median"]) for r in rows])
    ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1, label="Pareto frontier")
    ax.set_xlabel("throughput (tokens / s, all requests)")
    ax.set_ylabel("median request latency (s)")
    ax.set_title("Latency–throughput (batch sizes 1..b)")
    ax.legend(fontsize=8)
    return Figure(key, "latency–throughput Pareto frontier", _save(fig, out_dir, key),
                  [files[b] for b in loaded])  # fmt: skip


def fig_beta(results_dir: Path, out_dir: Path, quick: bool) -> Figure | None:
    """Cache hit rate, acceptance and tok/s vs β (T = 0.7)."""
    key = "beta_sweep"
    path, results = _results(results_dir, "sweep-beta", quick)
    if results is None:
        return _skip(key, f"{path} missing")
    rows = beta_rows(results)
    if not rows:
        return _skip(key, f"{path} has no β points")
    betas = [r["beta"] for r in rows]
    fig = MplFigure(figsize=(10, 3.5))
    panels = (("hit_rate", "cache hit rate"), ("acceptance_rate", "acceptance (L−1)/γ"),
              ("tok_per_s", "tokens / s"))  # fmt: skip
    ref = reference(results)
    for i, (field_name, label) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        ys = [r[field_name] if r[field_name] is not None else float("nan") for r in rows]
        ax.plot(betas, ys, marker="o", label="SSD")
        if field_name == "tok_per_s" and ref:
            ax.axhline(summary_of(results)[ref]["tok_per_s"], color="grey", ls="--", label=ref)
            ax.legend(fontsize=8)
        ax.invert_xaxis()  # β = 1 (no down-weighting) on the left
        ax.set_xlabel("β")
        ax.set_ylabel(label)
    temperature = results["settings"]["sampling"]["temperature"]
    fig.suptitle(f"Saguaro sampling: β sweep at T = {temperature:g}")
    return Figure(key, "hit rate, acceptance and tok/s vs β", _save(fig, out_dir, key), [path])


def fig_fanout(results_dir: Path, out_dir: Path, quick: bool) -> Figure | None:
    """Geometric vs uniform fan-out at equal budget: trace replay and the live sweep."""
    key = "fanout_geometric_vs_uniform"
    trace_path = results_dir / TRACE_REPLAY
    live_path, live = _results(results_dir, "sweep-fanout", quick)
    depth, trace = trace_rows(trace_path)
    if not trace and live is None:
        return _skip(key, f"neither {trace_path} nor {live_path}")
    panels = [p for p in (("trace", trace), ("live", live)) if p[1]]
    fig = MplFigure(figsize=(5.5 * len(panels), 4))
    sources = []
    for i, (kind, data) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        if kind == "trace":
            sources.append(trace_path)
            for shape in ("geometric", "uniform"):
                for name in sorted({r.get("trace", "") for r in data}):
                    mine = [r for r in data if r["fanout"] == shape and r.get("trace", "") == name]
                    pts = sorted((r["budget"], r["hit_rate"]) for r in mine)
                    ax.plot(*zip(*pts, strict=True), marker="o", label=f"{shape} ({name})")
            ax.set_title("Replayed traces (same outcomes)" + (f", depth {depth}" if depth else ""))
        else:
            sources.append(live_path)
            rows = fanout_rows(data)
            for shape in ("geometric", "uniform"):
                pts = sorted((r["budget"], r["hit_rate"]) for r in rows
                             if r["fanout"] == shape and r["hit_rate"] is not None)  # fmt: skip
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=shape)
            ax.set_title("Live servers (greedy)")
        _log2_axis(ax, [x for line in ax.get_lines() for x in line.get_xdata()])
        ax.set_xlabel("fan-out budget B (cached outcomes per round)")
        ax.set_ylabel("cache hit rate")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8)
    return Figure(key, "geometric vs uniform fan-out", _save(fig, out_dir, key), sources)


def fig_backup(results_dir: Path, out_dir: Path, quick: bool) -> Figure | None:
    """tok/s of each cache-miss backup vs batch size, with the policy's b* marked."""
    key = "backup_vs_batch"
    files = backup_files(results_dir, quick)
    loaded = {b: r for b, p in files.items() if (r := load(p)) is not None}
    if not loaded:
        return _skip(key, "no sweep-backup-b*.json results")
    rows = backup_rows(loaded)
    fig = MplFigure(figsize=(6, 4))
    ax = fig.add_subplot()
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = sorted((r for r in rows if r["config"] == config), key=lambda r: r["batch_size"])
        ls = "--" if mine[0]["backup"] is None else "-"
        ax.plot([r["batch_size"] for r in mine], [r["tok_per_s"] for r in mine], ls=ls,
                marker="o", label=config)  # fmt: skip
    known, b_star = policy_b_star(rows)
    notes = []
    if known and b_star is not None:
        ax.axvline(b_star, color="red", lw=1, ls=":", label=f"b* = {b_star} (policy)")
        notes.append(f"The policy's b* (auto, from its live estimates): {b_star}")
    elif known:
        notes.append("The policy's b*: none (auto never leaves JIT at these estimates)")
    else:
        notes.append("The server reported no miss policy (b* unknown)")
    _log2_axis(ax, [r["batch_size"] for r in rows])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens / s")
    ax.set_title("Cache-miss backup vs batch size (greedy)")
    ax.legend(fontsize=8)
    return Figure(key, "JIT vs n-gram vs random backup vs batch size",
                  _save(fig, out_dir, key), [files[b] for b in loaded], notes)  # fmt: skip


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


def fig_prediction(results_dir: Path, out_dir: Path, quick: bool) -> Figure | None:
    """The speedup model's prediction (from measured p_hit and latencies) vs measured speedup."""
    key = "predicted_vs_measured"
    rows = prediction_rows(results_dir, quick)
    if not rows:
        return _skip(key, "no results with SSD counters and an AR reference")
    fig = MplFigure(figsize=(5, 5))
    ax = fig.add_subplot()
    for source in dict.fromkeys(r["source"] for r in rows):
        mine = [r for r in rows if r["source"] == source]
        ax.scatter([r["speedup"] for r in mine], [r["predicted"] for r in mine], label=source)
    hi = max(max(r["speedup"], r["predicted"]) for r in rows) * 1.1
    ax.plot([0, hi], [0, hi], color="grey", ls="--", lw=0.8, label="prediction = measured")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("measured speedup over AR")
    ax.set_ylabel("predicted speedup (Theorem 7, measured inputs)")
    ax.set_title("Speedup model vs measurement")
    ax.legend(fontsize=7)
    sources = sorted({results_dir / r["source"] for r in rows})
    return Figure(key, "predicted vs measured speedup", _save(fig, out_dir, key), sources)


FIGURES: tuple[Callable[[Path, Path, bool], Figure | None], ...] = (
    fig_datasets,
    fig_speedup_vs_batch,
    fig_pareto,
    fig_beta,
    fig_fanout,
    fig_backup,
    fig_prediction,
)


def figures_dir(results_dir: Path, quick: bool) -> Path:
    return Path(results_dir) / results_name("figures", quick)


def make_all(results_dir: Path, quick: bool, out_dir: Path | None = None) -> list[Figure]:
    """Draw every figure whose inputs exist; returns the drawn ones in `FIGURES` order."""
    results_dir = Path(results_dir)
    out_dir = out_dir or figures_dir(results_dir, quick)
    return [f for fn in FIGURES if (f := fn(results_dir, out_dir, quick)) is not None]

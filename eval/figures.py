"""PNG figures of the paper's experiments, drawn from results JSON files (`eval.sweep`).

Each figure function takes the results folder and the output folder and returns a `Figure`
(the PNG and the JSON files behind it), or None with a logged reason when its inputs are
missing. The data behind the figures comes from `eval.result_rows`, as the report's tables do.
Matplotlib's object API with the Agg canvas: no pyplot, no display.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure as MplFigure

from eval.result_rows import (
    TRACE_REPLAY,
    backup_files,
    backup_rows,
    beta_rows,
    dataset_rows,
    fanout_rows,
    load,
    policy_b_star,
    prediction_rows,
    reference,
    results_file,
    speedup_rows,
    summary_of,
    trace_rows,
)
from eval.sweep import results_name

logger = logging.getLogger(__name__)


@dataclass
class Figure:
    """One drawn figure: its PNG and the results files it was drawn from."""

    key: str
    title: str
    png: Path
    sources: list[Path]
    notes: list[str] = field(default_factory=list)


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
    path, results = results_file(results_dir, "paper-main", quick)
    if results is None:
        return _skip(key, f"{path} missing")
    fig = MplFigure(figsize=(7, 4))
    _dataset_bars(fig.add_subplot(), dataset_rows(results))
    fig.axes[0].set_title("Throughput per prompt set (batch 1, greedy)")
    return Figure(key, "tok/s per dataset", _save(fig, out_dir, key), [path])


def fig_eagle3(results_dir: Path, out_dir: Path, quick: bool) -> Figure | None:
    """Grouped bars per run of `python -m eval eagle3` (batch size, sampling): tok/s of AR,
    STANDALONE, EAGLE3, SSD with the 0.5B draft and SSD with the EAGLE-3 head per prompt set."""
    key = "eagle3_comparison"
    pattern = re.compile(rf"eagle3-b(\d+)-([\w.]+?){'-quick' if quick else ''}\.json")
    runs = [
        (p, results)
        for p in sorted(results_dir.glob("eagle3-b*.json"))
        if pattern.fullmatch(p.name) and (results := load(p)) is not None
    ]
    if not runs:
        return _skip(key, "no eagle3-b*.json results (python -m eval eagle3)")
    fig = MplFigure(figsize=(6 * len(runs), 4))
    names = dict.fromkeys(c["name"] for _, results in runs for c in results["configs"])
    colors = {name: f"C{i}" for i, name in enumerate(names)}  # one colour per configuration
    for i, (path, results) in enumerate(runs):
        ax = fig.add_subplot(1, len(runs), i + 1)
        _dataset_bars(ax, dataset_rows(results), colors)
        batch, sampling = pattern.fullmatch(path.name).groups()  # type: ignore[union-attr]
        ax.set_title(f"EAGLE-3 comparison (batch {batch}, {sampling})")
    return Figure(key, "EAGLE-3 comparison", _save(fig, out_dir, key), [p for p, _ in runs])


def _dataset_bars(
    ax: Any, rows: dict[str, dict[str, float]], colors: Mapping[str, str] | None = None
) -> None:
    """Grouped bars on `ax`: per-request tok/s (`dataset_rows`) of each configuration per prompt
    set, coloured by `colors` (configuration -> matplotlib colour) where given."""
    sets = sorted({d for per in rows.values() for d in per})
    width = 0.8 / max(1, len(rows))
    for i, (config, per) in enumerate(rows.items()):
        xs = [j + i * width for j in range(len(sets))]
        color = (colors or {}).get(config)
        ax.bar(xs, [per.get(d, 0.0) for d in sets], width, label=config, color=color)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))], sets)
    ax.set_ylabel("tokens / s per request")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.4)  # room for the legend above the bars
    ax.legend(fontsize=8, loc="upper center", ncol=3)


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
    path, results = results_file(results_dir, "sweep-beta", quick)
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
    live_path, live = results_file(results_dir, "sweep-fanout", quick)
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
    fig_eagle3,
    fig_speedup_vs_batch,
    fig_pareto,
    fig_beta,
    fig_fanout,
    fig_backup,
    fig_prediction,
)


def machine_label(results: Mapping[str, Any]) -> str:
    """The machine a results file was measured on, for a figure's title: CPU model, cores, the
    ISA extensions that decide CPU speed (AMX, AVX-512 BF16, VNNI, else AVX2) and any kernel
    caps (`machine.isa_caps`)."""
    machine = results.get("machine") or {}
    cpu = machine.get("lscpu") or {}
    isa = set(str(cpu.get("isa", "")).split(","))
    widest = [n for n in ("amx_bf16", "avx512_bf16", "avx512_vnni") if n in isa] or ["avx2"]
    caps = machine.get("isa_caps") or {}
    capped = f", capped {caps['ATEN_CPU_CAPABILITY']}" if caps.get("ATEN_CPU_CAPABILITY") else ""
    cores = cpu.get("CPU(s)", machine.get("cpu_count", "?"))
    return f"{cpu.get('Model name', 'unknown CPU')}, {cores} CPUs, {'/'.join(widest)}{capped}"


def fig_throughput(results_path: Path, out_png: Path) -> Path:
    """Horizontal bars: tok/s of each configuration of one results file (`eval run`, `eval
    ssd`), each labelled with its ratio to the file's AR reference, titled with the batch size,
    tokens, prompts and the machine (`machine_label`); the README's headline figure.

    Raises:
        ValueError: when the file has no measured batches.
    """
    results = load(Path(results_path))
    if results is None:
        raise ValueError(f"{results_path}: no measured batches")
    summary = summary_of(results)
    ref = reference(results)
    base = summary[ref]["tok_per_s"] if ref in summary else None
    names = [c["name"] for c in results["configs"] if c["name"] in summary]
    fig = MplFigure(figsize=(7, 0.5 * len(names) + 1.6))
    ax = fig.add_subplot()
    values = [summary[n]["tok_per_s"] for n in names]
    ax.barh(names[::-1], values[::-1], color=[f"C{i}" for i in range(len(names))][::-1])
    for y, value in enumerate(values[::-1]):
        ratio = f"  {value / base:.2f}× {ref}" if base else ""
        ax.text(value, y, f" {value:.2f}{ratio}", va="center", fontsize=8)
    ax.set_xlim(0, max(values) * 1.45)
    ax.set_xlabel("tokens / s (all requests)")
    settings = results["settings"]
    sampling = settings["sampling"]
    ax.set_title(
        f"batch {settings['batch_size']}, {len(results['prompts'])} prompts × "
        f"{sampling['max_new_tokens']} tokens, "
        f"{'greedy' if sampling.get('greedy') else 'T = ' + str(sampling['temperature'])}\n"
        f"{machine_label(results)}\n{Path(results_path).name}",
        fontsize=9,
    )
    out_png = Path(out_png)
    return _save(fig, out_png.parent, out_png.stem)


def figures_dir(results_dir: Path, quick: bool) -> Path:
    return Path(results_dir) / results_name("figures", quick)


def make_all(results_dir: Path, quick: bool, out_dir: Path | None = None) -> list[Figure]:
    """Draw every figure whose inputs exist; returns the drawn ones in `FIGURES` order."""
    results_dir = Path(results_dir)
    out_dir = out_dir or figures_dir(results_dir, quick)
    return [f for fn in FIGURES if (f := fn(results_dir, out_dir, quick)) is not None]

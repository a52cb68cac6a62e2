"""The SSD benchmark: AR vs STANDALONE vs `--ssd-mode sync` vs SSD, two arrangements.

Arrangements on a machine with CPUs ``t`` (target) and ``d`` (draft):

- ``paper``: the baselines run on the target's core alone (AR, STANDALONE, and sync SSD with
  target and speculator sharing that core); SSD adds the draft's core for the speculator. This
  is the paper's comparison: SSD's speculator gets hardware that SD leaves idle.
- ``equal``: every configuration gets both cores. AR and STANDALONE use them as two threads;
  sync SSD (SYNC-2c) gives target and speculator both cores in turn (sync mode never runs them
  at once), the best synchronous SD on this hardware with SSD's own draft runtime.

SSD (async) is the same server in both arrangements and runs once. Every configuration uses the
same γ, top-k 1, dtype and KV pool (`eval.configs`), except where asked for more:
`standalone_lookaheads` runs STANDALONE-2c once per γ (`STANDALONE-2c-g3`, ...; the fastest
is the STANDALONE-2c baseline of the comparisons), and `ssd_runtimes` adds SSD-1+1c on other draft
runtimes (`SSD-1+1c-torch`: the bf16 reference), each compared with SSD-1+1c.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eval import bootstrap, ssd_stats
from eval import configs as presets
from eval.configs import Config
from sglang_ssd.config import DEFAULT_LOOKAHEAD

ARRANGEMENTS = ("paper", "equal")
STANDALONE_2C = "STANDALONE-2c"
SSD_1_1C = "SSD-1+1c"
SSD_AUTO = "SSD-auto"  # `--ssd-mode auto`: each round's arrangement measured fastest


def bench_configs(
    target: Path | str,
    draft: Path | str,
    arrangements: Sequence[str] = ARRANGEMENTS,
    *,
    lookahead: int = DEFAULT_LOOKAHEAD,
    target_cpu: int = 0,
    draft_cpu: int = 1,
    ssd_extra: Sequence[str] = (),
    standalone_lookaheads: Sequence[int] = (),
    ssd_runtimes: Sequence[str] = (),
) -> list[Config]:
    """The configurations for `arrangements`; the first is the reference (ratios, identity).

    `standalone_lookaheads` (equal arrangement): one STANDALONE-2c per γ, named
    `STANDALONE-2c-g{γ}`, instead of one at `lookahead`. `ssd_runtimes`: one more SSD-1+1c per
    `--ssd-draft-runtime` name, named `SSD-1+1c-{name}`.

    Raises:
        ValueError: on an unknown arrangement, equal CPU ids or a γ below 1.
    """
    unknown = set(arrangements) - set(ARRANGEMENTS)
    if unknown or not arrangements:
        raise ValueError(f"arrangements must be among {ARRANGEMENTS}, got {list(arrangements)}")
    if target_cpu == draft_cpu:
        raise ValueError("the target and draft CPUs must differ")
    if any(g < 1 for g in standalone_lookaheads):
        raise ValueError(f"every STANDALONE γ must be >= 1, got {list(standalone_lookaheads)}")
    one, both = (target_cpu,), (target_cpu, draft_cpu)
    kw: dict[str, Any] = {"lookahead": lookahead}
    out: list[Config] = []
    if "paper" in arrangements:
        out += [
            presets.autoregressive(target, name="AR-1c", cpus=one),
            presets.standalone(target, draft, name="STANDALONE-1c", cpus=one, **kw),
            presets.ssd(target, draft, name="SYNC-1c", mode="sync", cpus=one, **kw),
        ]
    if "equal" in arrangements:
        standalones = [
            presets.standalone(target, draft, name=f"{STANDALONE_2C}-g{g}", cpus=both, lookahead=g)
            for g in standalone_lookaheads
        ] or [presets.standalone(target, draft, name=STANDALONE_2C, cpus=both, **kw)]
        out += [
            presets.autoregressive(target, name="AR-2c", cpus=both),
            *standalones,
            # Target and speculator take turns on both cores (sync mode never overlaps them).
            presets.ssd(
                target, draft, name="SYNC-2c", mode="sync", cpus=both, draft_cpus=both,
                extra=ssd_extra, **kw,
            ),
        ]  # fmt: skip
    ssds = [
        presets.ssd(target, draft, name=name, cpus=both, draft_cpus=(draft_cpu,), extra=extra, **kw)
        for name, extra in [
            (SSD_1_1C, ssd_extra),
            *((f"{SSD_1_1C}-{r}", (*ssd_extra, "--ssd-draft-runtime", r)) for r in ssd_runtimes),
        ]
    ]
    if "equal" in arrangements:  # the default on the same 2 cores as SSD-1+1c
        ssds.append(
            presets.ssd(
                target, draft, name=SSD_AUTO, mode="auto", cpus=both, draft_cpus=(draft_cpu,),
                extra=ssd_extra, **kw,
            )
        )  # fmt: skip
    return [*out, *ssds]


def select(configs: Sequence[Config], names: Sequence[str]) -> list[Config]:
    """The configurations called `names`, in that order (the first becomes the reference).

    Raises:
        ValueError: on a name no configuration has, or no names at all.
    """
    by_name = {c.name: c for c in configs}
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise ValueError(f"unknown configuration(s) {unknown}; known: {list(by_name)}")
    return [by_name[n] for n in names]


# (SSD configuration, baseline, arrangement, aims by setting kind (`setting_kind`)): the
# goals, each met only when the bootstrap interval's lower end reaches it.
COMPARISONS: tuple[tuple[str, str, str, Mapping[str, float]], ...] = (
    ("SSD-1+1c", "STANDALONE-1c", "paper", {"b1-greedy": 2.0}),
    ("SSD-1+1c", "SYNC-1c", "paper", {"b1-greedy": 1.3}),
    ("SSD-1+1c", "AR-1c", "paper", {}),
    ("SSD-1+1c", "STANDALONE-2c", "equal", {"b1-greedy": 1.3}),
    ("SSD-1+1c", "SYNC-2c", "equal", {"b1-sampled": 1.15}),
    ("SSD-1+1c", "AR-2c", "equal", {"b1-greedy": 1.6, "b1-sampled": 1.3, "b4-greedy": 1.15}),
    ("SYNC-1c", "AR-1c", "paper", {}),
    ("SYNC-2c", "AR-2c", "equal", {}),
    ("STANDALONE-1c", "AR-1c", "paper", {}),
    ("STANDALONE-2c", "AR-2c", "equal", {}),
)
AR_OF = {"paper": "AR-1c", "equal": "AR-2c"}
# SGLang's speculative algorithms whose CPU verify is greedy (configuration name prefixes).
GREEDY_VERIFY_ON_CPU = ("STANDALONE", "EAGLE3")


def setting_kind(batch_size: int, greedy: bool) -> str:
    """The key of a run's aims in `COMPARISONS`, e.g. "b1-greedy", "b4-greedy", "b1-sampled"."""
    return f"b{batch_size}-{'greedy' if greedy else 'sampled'}"


def comparisons(
    results: Mapping[str, Any],
    pairs: Sequence[tuple[str, str, str, Mapping[str, float]]] = COMPARISONS,
) -> list[dict[str, Any]]:
    """Speedup of each pair of `pairs` (default: `COMPARISONS`) present in `results`, its 90%
    bootstrap interval
    over prompts (`eval.bootstrap`), the aim and whether the interval's lower end meets it
    (`met`), and, for SSD vs AR, the speedup model's prediction from SSD's own counters
    (`eval.ssd_stats.predict`). With per-γ STANDALONE-2c runs the fastest stands in for
    STANDALONE-2c (`best_variant`); each `SSD-1+1c-{runtime}` run is compared with SSD-1+1c."""
    summary = results["summary"]["configs"]
    best = best_variant(summary, STANDALONE_2C)
    variants = [n for n in summary if n.startswith(f"{SSD_1_1C}-")]

    def resolve(n: str) -> str:
        return best if n == STANDALONE_2C and best else n

    pairs = [(resolve(n), resolve(b), arr, aims) for n, b, arr, aims in pairs]
    pairs += [(SSD_1_1C, v, "equal", {}) for v in variants]
    settings = results["settings"]
    greedy = settings["sampling"]["greedy"]
    batch = settings["batch_size"]
    lookaheads = {c["name"]: c.get("lookahead") or DEFAULT_LOOKAHEAD for c in results["configs"]}
    rows = []
    kind = setting_kind(batch, greedy)
    for name, base, arrangement, aims in pairs:
        if name not in summary or base not in summary:
            continue
        a, b = summary[name]["tok_per_s"], summary[base]["tok_per_s"]
        row: dict[str, Any] = {
            "config": name,
            "baseline": base,
            "arrangement": arrangement,
            "speedup": a / b if a and b else None,
            "aim": aims.get(kind),
        }
        interval = bootstrap.ratio_interval(
            bootstrap.work_by_prompt(results["batches"], name),
            bootstrap.work_by_prompt(results["batches"], base),
        )
        row["interval"] = list(interval) if interval else None
        row["met"] = interval[0] >= row["aim"] if interval and row["aim"] is not None else None
        m = summary[name].get("ssd")
        if m and base == AR_OF[arrangement] and b:
            predicted = ssd_stats.predict(
                m,
                lookaheads.get(name, DEFAULT_LOOKAHEAD),
                batch,
                b,
                async_mode=name.startswith("SSD"),
            )
            row["predicted"] = predicted
            row["prediction_error"] = (
                predicted / row["speedup"] - 1 if predicted and row["speedup"] else None
            )
        lossy = [n for n in (name, base) if n.startswith(GREEDY_VERIFY_ON_CPU)]
        if not greedy and lossy:
            row["note"] = f"{lossy[0]} is not lossless at T > 0 on CPU (greedy verify)"
        rows.append(row)
    return rows


def best_variant(summary: Mapping[str, Any], base: str) -> str | None:
    """The fastest (tok/s) of `base`'s per-γ variants (`{base}-g{γ}`) in a results summary, or
    None when it has none (then `base` itself is the baseline)."""
    rates = {n: c["tok_per_s"] or 0.0 for n, c in summary.items() if n.startswith(f"{base}-g")}
    return max(rates, key=rates.__getitem__) if rates else None


def format_comparisons(rows: Sequence[Mapping[str, Any]]) -> str:
    """Plain-text table of `comparisons`."""
    header = (
        "config",
        "vs",
        "arrangement",
        "speedup",
        "90% CI",
        "aim",
        "met",
        "model",
        "model error",
    )
    lines = [header]
    for r in rows:
        lines.append(
            (
                r["config"],
                r["baseline"],
                r["arrangement"],
                _x(r["speedup"]),
                "" if not r.get("interval") else "{:.2f}–{:.2f}".format(*r["interval"]),
                "" if r.get("aim") is None else f"≥{r['aim']:.2f}",
                {True: "yes", False: "no", None: ""}[r.get("met")],
                _x(r.get("predicted")),
                "" if r.get("prediction_error") is None else f"{100 * r['prediction_error']:+.0f}%",
            )
        )
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(header))]
    text = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)) for row in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(t.rstrip() for t in text)


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"

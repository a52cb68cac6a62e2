"""The distribution check end to end: the pair, its power, the negative controls, the servers'
samples, the χ² of each configuration, a verdict; written as one JSON results file."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eval.distribution.draws import CONFIGS, NEW_TOKENS, SSD_CONFIGS, Draws, draw_ar, draw_ssd
from eval.distribution.power import PowerRow, broken_rejection_rates, power_row
from eval.distribution.reference import Cells
from eval.distribution.statistic import ChiSquareResult, chi_square, total_variation
from eval.distribution.tiny_pair import BROKEN, PROMPTS, Pair, prepare_pair, speculative_samples

CONTROL_SEED = 1234


def negative_control(
    pair: Pair, bug: str | None, samples_per_prompt: int, seed: int = CONTROL_SEED
) -> tuple[ChiSquareResult, list[float]]:
    """The statistic on an in-process speculative sampler (exact if `bug` is None, else the
    `BROKEN` verifier `bug`), no server; also the sampler's TV from p per prompt."""
    generator = torch.Generator().manual_seed(seed)
    counts = [
        cells.counts(
            speculative_samples(
                pair.target, pair.draft, prompt, NEW_TOKENS, samples_per_prompt, bug, generator
            )
        )
        for prompt, cells in zip(PROMPTS, pair.cells, strict=True)
    ]
    result = chi_square(counts, [c.probs["target"] for c in pair.cells])
    law = bug or "target"
    tv = [total_variation(c.probs["target"], c.probs[law]) for c in pair.cells]
    return result, tv


def draws_chi_square(cells: Sequence[Cells], draws: Draws) -> ChiSquareResult:
    """The check's statistic on one configuration's samples (all prompts)."""
    counts = [c.counts(s) for c, s in zip(cells, draws.samples, strict=True)]
    return chi_square(counts, [c.probs["target"] for c in cells])


def _result_json(result: ChiSquareResult) -> dict[str, Any]:
    return {
        "statistic": round(result.statistic, 3),
        "df": result.df,
        "p_value": result.p_value,
        "samples": result.samples,
        "rejects": result.rejects,
    }


def configuration_json(cells: Sequence[Cells], draws: Draws) -> dict[str, Any]:
    """χ² over all prompts and per prompt, sample counts and the run's round statistics."""
    per_prompt = [
        _result_json(chi_square([c.counts(s)], [c.probs["target"]]))
        for c, s in zip(cells, draws.samples, strict=True)
    ]
    return {
        "chi_square": _result_json(draws_chi_square(cells, draws)),
        "per_prompt": per_prompt,
        "samples_per_prompt": [len(s) for s in draws.samples],
        "summary": draws.summary(),
    }


def controls_json(pair: Pair, samples_per_prompt: int) -> dict[str, Any]:
    """Every negative control at `samples_per_prompt`: exact sampling must pass, every broken
    verifier must be rejected."""
    out = {}
    for bug in [None, *BROKEN]:
        result, tv = negative_control(pair, bug, samples_per_prompt)
        out[bug or "exact"] = {
            "tv": [round(t, 4) for t in tv],
            **_result_json(result),
            "as_expected": result.rejects == (bug is not None),
        }
    return out


def verdict(results: dict[str, Any]) -> str:
    """ "pass" if every configuration was sampled and passed, and every negative control came out
    as it should; else "fail"."""
    configurations = results["configurations"]
    passed = all(not c["chi_square"]["rejects"] for c in configurations.values())
    controls = all(c["as_expected"] for c in results["negative_controls"].values())
    return "pass" if passed and controls and set(configurations) == set(CONFIGS) else "fail"


def power_and_controls(
    pair: Pair, samples_per_prompt: int, compare_sizes: Sequence[int]
) -> dict[str, Any]:
    """The power table (at `samples_per_prompt` and `compare_sizes`), the broken verifiers'
    rejection rates and the negative controls, all at the run's size (seeded)."""
    sizes = sorted({*compare_sizes, samples_per_prompt})
    return {
        "power": [asdict(power_row(pair.cells, n)) for n in sizes],
        "broken_rejection_rates": broken_rejection_rates(
            pair.cells, list(BROKEN), samples_per_prompt
        ),
        "negative_controls": controls_json(pair, samples_per_prompt),
    }


def _earlier(out: Path, samples_per_prompt: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Configurations already sampled at this size in `out`, and the headers of those runs."""
    if not out.exists():
        return {}, []
    previous = json.loads(out.read_text())
    if previous.get("samples_per_prompt") != samples_per_prompt:
        raise ValueError(f"{out} holds {previous.get('samples_per_prompt')} samples per prompt")
    header = {k: previous[k] for k in ("command", "date", "git") if k in previous}
    configurations = previous.get("configurations", {})
    for entry in configurations.values():
        entry.setdefault("date", header.get("date"))
    return configurations, [*previous.get("earlier_runs", []), header]


def run(
    samples_per_prompt: int,
    compare_sizes: Sequence[int],
    out: Path,
    logs: Path,
    header: dict[str, Any],
    progress: Callable[[str], None] = print,
    resume: bool = False,
) -> dict[str, Any]:
    """Build the pair, compute `power_and_controls`, then sample every configuration (with
    `resume`, only those `out` does not hold yet at this size); `out` is rewritten after each
    step (status "running", then "done"). Each configuration records the date of its run."""
    logs.mkdir(parents=True, exist_ok=True)
    configurations, earlier = _earlier(out, samples_per_prompt) if resume else ({}, [])
    results: dict[str, Any] = {**header, "status": "running"}
    results["samples_per_prompt"] = samples_per_prompt
    if earlier:
        results["earlier_runs"] = earlier

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=_json_default))

    def record(name: str, draws: Draws) -> None:
        configurations[name] = {**configuration_json(pair.cells, draws), "date": header["date"]}
        progress(f"{name}: {configurations[name]['chi_square']}")
        save()

    with tempfile.TemporaryDirectory() as tmp:
        pair = prepare_pair(Path(tmp), NEW_TOKENS)
        results.update(power_and_controls(pair, samples_per_prompt, compare_sizes))
        for row in results["power"]:
            progress(str(PowerRow(**row)))
        progress(f"negative controls: {results['negative_controls']}")
        results["configurations"] = configurations
        save()
        if "ar" not in configurations:
            record("ar", draw_ar(pair.target_dir, logs, samples_per_prompt))
        missing = [name for name in SSD_CONFIGS if name not in configurations]
        if missing:
            draw_ssd(pair.target_dir, pair.draft_dir, logs, samples_per_prompt, record, missing)
    results["verdict"] = verdict(results)
    results["status"] = "done"
    save()
    return results


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")

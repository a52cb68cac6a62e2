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

from eval.distribution.draws import CONFIGS, NEW_TOKENS, Draws, draw_ar, draw_ssd
from eval.distribution.power import broken_rejection_rates, power_row
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


def run(
    samples_per_prompt: int,
    compare_sizes: Sequence[int],
    out: Path,
    logs: Path,
    header: dict[str, Any],
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build the pair, compute the power table (at `samples_per_prompt` and `compare_sizes`),
    run the negative controls, then sample every configuration; `out` is rewritten after each
    step (status "running", then "done")."""
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        **header,
        "status": "running",
        "samples_per_prompt": samples_per_prompt,
    }

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=_json_default))

    def record(name: str, draws: Draws) -> None:
        results["configurations"][name] = configuration_json(pair.cells, draws)
        progress(f"{name}: {results['configurations'][name]['chi_square']}")
        save()

    with tempfile.TemporaryDirectory() as tmp:
        pair = prepare_pair(Path(tmp), NEW_TOKENS)
        sizes = sorted({*compare_sizes, samples_per_prompt})
        rows = [power_row(pair.cells, n) for n in sizes]
        for row in rows:
            progress(str(row))
        results["power"] = [asdict(row) for row in rows]
        results["broken_rejection_rates"] = broken_rejection_rates(
            pair.cells, list(BROKEN), samples_per_prompt
        )
        results["negative_controls"] = controls_json(pair, samples_per_prompt)
        progress(f"negative controls: {results['negative_controls']}")
        results["configurations"] = {}
        save()
        record("ar", draw_ar(pair.target_dir, logs, samples_per_prompt))
        draw_ssd(pair.target_dir, pair.draft_dir, logs, samples_per_prompt, record)
    results["verdict"] = verdict(results)
    results["status"] = "done"
    save()
    return results


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")

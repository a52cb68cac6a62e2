"""`python -m eval model`: the speedup model, from one run's component timings, against other
runs' measured speedups at the same batch size (`eval.model_check`;
eval/results/model-check.json)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from eval import model_check
from eval.cli_options import BadInput
from eval.commands.run_args import RESULTS
from eval.configs import Config
from eval.results_io import read_results

HELP = "the speedup model's predictions against measured runs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The components' files and configuration, the predicted files, the AR reference, --out."""
    p.add_argument(
        "--components", type=Path, nargs="+", required=True,
        help="results files whose SSD counters give the components (one per batch size)",
    )  # fmt: skip
    p.add_argument(
        "--components-config", help="SSD configuration of those files (default: the first)"
    )
    p.add_argument(
        "--target", type=Path, nargs="+", required=True,
        help="results files whose SSD rows the model predicts (matched by batch size)",
    )  # fmt: skip
    p.add_argument(
        "--ar", default="AR-2c", help="the AR configuration speedups refer to (default: AR-2c)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "model-check.json",
        help="results JSON (default: eval/results/model-check.json, overwritten)",
    )


def first_async_ssd(results: dict) -> str:
    """The name of the first `--ssd-mode async` SSD configuration of a results document.

    Raises:
        BadInput: there is none.
    """
    for c in map(Config.from_dict, results["configs"]):
        if c.algorithm == "SSD" and c.ssd_mode == "async":
            return c.name
    raise BadInput("no SSD configuration in the components file")


def run(a: argparse.Namespace) -> int:
    """Predict each `--target` file's SSD rows from the components at its batch size; write
    `--out`.

    Raises:
        BadInput: a file without the rows the model needs, or a batch size without components.
    """
    by_batch = {}
    for path in a.components:
        results = read_results(path)
        name = a.components_config or first_async_ssd(results)
        try:
            comp = model_check.components(results, name, a.ar)
        except ValueError as exc:
            raise BadInput(f"{path}: {exc}") from exc
        by_batch[comp.batch_size] = {"file": str(path), "config": name, "components": comp}
    out: dict[str, list] = {"checks": []}
    for path in a.target:
        results = read_results(path)
        batch = int(results["settings"]["batch_size"])
        if batch not in by_batch:
            raise BadInput(f"{path}: batch {batch}, no components at that batch size")
        source = by_batch[batch]
        try:
            rows = model_check.check(source["components"], results, a.ar)
        except ValueError as exc:
            raise BadInput(f"{path}: {exc}") from exc
        print(f"\n{path} from {source['file']} ({source['config']}):")
        print(model_check.report(source["components"], rows))
        components = dataclasses.asdict(source["components"])
        out["checks"].append(
            {"target": str(path), **source, "components": components, "rows": rows}
        )
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\nwrote {a.out}")
    return 0

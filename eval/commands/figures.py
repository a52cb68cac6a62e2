"""`python -m eval figures`: PNGs from the results files (eval/results/figures[-quick]/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import figures as drawings
from eval.commands.run_args import RESULTS

HELP = "PNG figures from the results files"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`--quick` and the results folder."""
    p.add_argument("--quick", action="store_true", help="from the --quick results")
    p.add_argument("--results-dir", type=Path, default=RESULTS)


def run(a: argparse.Namespace) -> int:
    """Draw every figure whose inputs exist; print each with its sources."""
    drawn = drawings.make_all(a.results_dir, a.quick)
    for f in drawn:
        print(f"{f.png}  <- {', '.join(p.name for p in f.sources)}")
    print(f"{len(drawn)}/{len(drawings.FIGURES)} figures drawn (missing inputs are logged)")
    return 0

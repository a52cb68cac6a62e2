"""`python -m eval report`: the figures plus eval/results/report[-quick].md with the tables."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import report as reports
from eval.commands.run_args import RESULTS

HELP = "figures plus the markdown report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`--quick`, the results folder and the report's path."""
    p.add_argument("--quick", action="store_true", help="from the --quick results")
    p.add_argument("--results-dir", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, help="report path (default <results-dir>/report.md)")


def run(a: argparse.Namespace) -> int:
    """Write the report and print its path."""
    print(f"wrote {reports.write_report(a.results_dir, a.quick, a.out)}")
    return 0

"""`python -m eval show`: print the table of an existing results file (and draw its tok/s bars)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import figures
from eval.results_io import read_results
from eval.summary import format_table

HELP = "print the table of a results file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The results file and an optional figure path."""
    p.add_argument("results", type=Path)
    p.add_argument("--figure", type=Path, help="also draw its tok/s bars to this PNG")


def run(a: argparse.Namespace) -> int:
    """Print the file's status, prompts, settings and table.

    Raises:
        FileNotFoundError: no such results file; ValueError: not JSON.
    """
    results = read_results(a.results)
    print(
        f"{a.results}: status {results.get('status')}, "
        f"{len(results.get('prompts', []))} prompts, settings {results.get('settings')}"
    )
    print(format_table(results))
    if a.figure is not None:
        print(f"figure: {figures.fig_throughput(Path(a.results), a.figure)}")
    return 0

"""`python -m eval sweep KIND`: a sweep over SSD's run-time settings on one SSD server (no
restarts), with an AR reference: `beta` (T = 0.7), `fanout` (geometric vs uniform), `backup`
(batch 1, 2, 4) (`eval.sweep`)."""

from __future__ import annotations

import argparse

from eval import sweep as sweeps
from eval.commands.plans import add_experiment_options, plans_of
from eval.summary import format_table

HELP = "a sweep over SSD's run-time settings, no restarts"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sweep's kind, the experiments' options and `--resume`."""
    p.add_argument("kind", choices=sweeps.SWEEPS)
    add_experiment_options(p)
    p.add_argument("--resume", action="store_true", help="keep the points already measured")


def run(a: argparse.Namespace) -> int:
    """Run the sweep's points and print each one's table."""
    plans = plans_of(a, [a.kind], main=False)
    done = sweeps.run_plans(plans, results_dir=a.results_dir, log_dir=a.log_dir, resume=a.resume)
    for name, results in done.items():
        print(f"\n{name}\n{format_table(results)}")
    return 0

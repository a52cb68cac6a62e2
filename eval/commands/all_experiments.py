"""`python -m eval all`: the main comparison (AR, STANDALONE, sync, SSD on HumanEval and
MT-Bench), every sweep, then figures and report; resumes an interrupted run unless `--fresh`."""

from __future__ import annotations

import argparse

from eval import report, sweep
from eval.cli_options import BadInput
from eval.commands.plans import add_experiment_options, plans_of

HELP = "main comparison, every sweep, figures and report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The experiments' options and `--fresh`."""
    add_experiment_options(p)
    p.add_argument("--fresh", action="store_true", help="discard earlier results, start over")


def run(a: argparse.Namespace) -> int:
    """Run every plan, then write the report.

    Raises:
        BadInput: an earlier run with other settings is in the results folder.
    """
    plans = plans_of(a, sweep.SWEEPS, main=True)
    try:
        sweep.run_plans(plans, results_dir=a.results_dir, log_dir=a.log_dir, resume=not a.fresh)
    except ValueError as exc:  # an earlier run with other settings is in the way
        raise BadInput(f"{exc}; run with --fresh to start over") from exc
    print(f"wrote {report.write_report(a.results_dir, a.quick)}")
    return 0

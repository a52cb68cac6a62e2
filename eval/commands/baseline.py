"""`python -m eval baseline`: AR vs STANDALONE (γ = 4, top-k 1) on the real pair; `--pinned`
puts each server on one core (taskset -c 0, OMP_NUM_THREADS=1)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import cli_options
from eval import configs as presets
from eval.commands.interleaved import run_configs
from eval.commands.run_args import add_run_options

HELP = "AR vs STANDALONE on the real pair"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The run's options, `--pinned`, its CPUs, γ and the model pair."""
    add_run_options(p)
    p.add_argument(
        "--pinned",
        action="store_true",
        help="pin each server (target and draft) to --cpus with one thread per CPU",
    )
    cli_options.add_cpus(p, (0,), "CPUs for --pinned (default 0)")
    cli_options.add_lookahead(p, "γ for STANDALONE")
    cli_options.add_pair(p)


def run(a: argparse.Namespace) -> int:
    """Run AR and STANDALONE; eval/results/baseline-cpu[-pinned].json."""
    target, draft = presets.model_dirs(a.target, a.draft)
    cpus = a.cpus if a.pinned else ()
    configs = presets.baseline(target, draft, lookahead=a.lookahead, pinned_cpus=cpus)
    name = "baseline-cpu-pinned" if a.pinned else "baseline-cpu"
    run_configs(a, configs, a.tokenizer or Path(target), name)
    return 0

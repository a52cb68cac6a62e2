"""The sweeps' plans and their options, shared by `python -m eval sweep` and `all`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from eval import cli_options, sweep
from eval import configs as presets
from eval.commands.run_args import LOGS, RESULTS, target_and_draft_cpus


def add_experiment_options(p: argparse.ArgumentParser) -> None:
    """`--quick`, the model pair, tokenizer, CPUs, γ, results and log folders, `--dry-run`."""
    p.add_argument("--quick", action="store_true", help="a few prompts x tokens per point")
    cli_options.add_pair(p)
    p.add_argument("--tokenizer", type=Path, help="model folder for the chat template")
    cli_options.add_cpus(p)
    cli_options.add_lookahead(p)
    p.add_argument("--results-dir", type=Path, default=RESULTS)
    p.add_argument("--log-dir", type=Path, default=LOGS / "paper", help="server logs")
    p.add_argument("--dry-run", action="store_true", help="print the plan and estimate, stop")


def plans_of(a: argparse.Namespace, kinds: Sequence[str], main: bool) -> list[sweep.Plan]:
    """The main comparison's plan (if `main`) and each sweep of `kinds`, printed with their
    estimated time; exits 0 after printing under `--dry-run`."""
    target_cpu, draft_cpu = target_and_draft_cpus(a)
    target, draft = presets.model_dirs(a.target, a.draft)
    configs = sweep.base_configs(
        target, draft, lookahead=a.lookahead, target_cpu=target_cpu, draft_cpu=draft_cpu
    )
    prompts = sweep.prompt_source(a.tokenizer or Path(target))
    plans = [sweep.main_plan(list(configs.values()), prompts, quick=a.quick)] if main else []
    for kind in kinds:
        plans += sweep.sweep_plans(kind, configs[sweep.AR], configs[sweep.SSD], prompts,
                                   quick=a.quick)  # fmt: skip
    for name, line in sweep.describe(plans).items():
        print(f"{name}: {line}")
    print(
        f"estimated {sweep.estimate_s(plans) / 60:.0f} min on the real pair on 2 CPUs "
        "(assumed speeds; resumed points are skipped)",
        flush=True,
    )
    if a.dry_run:
        raise SystemExit(0)
    return plans

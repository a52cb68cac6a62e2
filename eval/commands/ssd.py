"""`python -m eval ssd`: the SSD benchmark. AR vs STANDALONE vs `--ssd-mode sync` vs SSD in the
paper's arrangement (baselines on one core, SSD adds the draft's core) and on equal hardware
(everything on both cores), with the speedup model's prediction (`eval.ssd_bench`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import cli_options, ssd_bench
from eval import configs as presets
from eval.commands.interleaved import add_compare_options, compare
from eval.commands.run_args import add_run_options, comma_list, target_and_draft_cpus
from eval.sampling import Sampling
from sglang_ssd.runtime_registry import NAMES as RUNTIME_NAMES

HELP = "AR vs STANDALONE vs SSD sync vs SSD, two arrangements"


def gamma_list(text: str) -> list[int]:
    """Comma-separated lookaheads ("3,4,5") as a list (an argparse type): at least one, each an
    integer >= 1, or an argparse error (exit 2) before anything starts."""
    try:
        gammas = [int(v) for v in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
    if not gammas or min(gammas) < 1:
        raise argparse.ArgumentTypeError(f"needs one or more integers >= 1, got {text!r}")
    return gammas


def runtime_list(text: str) -> list[str]:
    """Comma-separated `--ssd-draft-runtime` names as a list (an argparse type): an unknown name
    is refused here, not at the server's start an hour into a run."""
    names = comma_list(text)
    unknown = [n for n in names if n not in RUNTIME_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown or no draft runtime(s) {unknown}; known: {', '.join(RUNTIME_NAMES)}"
        )
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The run's options, the arrangement, extra SSD flags, STANDALONE's γs, draft runtimes."""
    add_run_options(p)
    p.add_argument(
        "--arrangement",
        choices=(*ssd_bench.ARRANGEMENTS, "both"),
        default="both",
        help="paper: the baselines on the target's core, SSD adds the draft's; equal: every "
        "configuration on both cores; both (default)",
    )
    cli_options.add_ssd_args(p)
    p.add_argument(
        "--standalone-gammas",
        type=gamma_list,
        default=[],
        metavar="G,G,...",
        help="run STANDALONE-2c once per γ (STANDALONE-2c-g3, ...); the fastest is the "
        "STANDALONE-2c baseline (default: one, at --lookahead)",
    )
    p.add_argument(
        "--ssd-runtimes",
        type=runtime_list,
        default=[],
        metavar="NAMES",
        help="also run SSD-1+1c with each of these --ssd-draft-runtime names (SSD-1+1c-NAME), "
        f"among {', '.join(RUNTIME_NAMES)}; e.g. torch for the bf16 reference",
    )
    add_compare_options(p, "e.g. AR-2c,SYNC-2c,SSD-1+1c")
    p.set_defaults(prompts=5, max_new_tokens=64, repeats=2)


def run(a: argparse.Namespace) -> int:
    """Run the comparison; eval/results/ssd-bench-<arrangement>-b<B>-<sampling>.json."""
    target_cpu, draft_cpu = target_and_draft_cpus(a)
    target, draft = presets.model_dirs(a.target, a.draft)
    arrangements = ssd_bench.ARRANGEMENTS if a.arrangement == "both" else (a.arrangement,)
    configs = ssd_bench.bench_configs(
        target,
        draft,
        arrangements,
        lookahead=a.lookahead,
        target_cpu=target_cpu,
        draft_cpu=draft_cpu,
        ssd_extra=a.ssd_args.split(),
        standalone_lookaheads=a.standalone_gammas,
        ssd_runtimes=a.ssd_runtimes,
    )
    name = f"ssd-bench-{a.arrangement}-b{a.batch_size}-{Sampling.of(a.temperature).name}"
    return compare(a, configs, Path(target), name, ssd_bench.comparisons)

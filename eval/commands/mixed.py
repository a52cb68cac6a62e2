"""`python -m eval mixed`: mixed traffic. 40 short requests (max_tokens 1-128, stop strings, 1-4
at once), AR on both cores vs SSD, ABAB x 2, with a 90% bootstrap interval over requests
(`eval.mixed`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eval import cli_options
from eval import configs as presets
from eval import mixed as traffic
from eval.commands.interleaved import run_configs
from eval.commands.run_args import add_run_options, target_and_draft_cpus

HELP = "mixed traffic: AR-2c vs SSD on short mixed requests"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The run's options, the draw's size, CPUs, extra SSD flags and SSD variants."""
    add_run_options(p)
    p.add_argument("--requests", type=int, default=40, help="requests in the draw")
    cli_options.add_cpus(p)
    cli_options.add_ssd_args(p)
    p.add_argument(
        "--ssd-variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="another SSD configuration to run alongside, e.g. "
        "'SSD-async=--ssd-mode async' (repeatable)",
    )
    p.add_argument(
        "--ssd-live",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="another SSD configuration on the SSD server itself, its live settings applied "
        """before each unit, e.g. 'SSD-sync={"mode": "sync"}' (repeatable)""",
    )
    cli_options.add_pair(p)
    p.set_defaults(repeats=2, servers="concurrent")


def run(a: argparse.Namespace) -> int:
    """Run AR-2c, SSD and the variants on one draw; eval/results/mixed-traffic.json."""
    target, draft = presets.model_dirs(a.target, a.draft)
    target_cpu, draft_cpu = target_and_draft_cpus(a)
    both = [target_cpu, draft_cpu]
    ssd = presets.ssd(
        target, draft, name=traffic.SSD, cpus=both, draft_cpus=[draft_cpu], extra=a.ssd_args.split()
    )
    configs = [
        presets.autoregressive(target, name=traffic.AR, cpus=both, threads=2),
        *presets.live_variants(ssd, a.ssd_live),
    ]
    for variant in a.ssd_variant:
        name, _, args = variant.partition("=")
        configs.append(
            presets.ssd(
                target, draft, name=name, cpus=both, draft_cpus=[draft_cpu], extra=args.split()
            )
        )
    shape = traffic.MixedShape(requests=a.requests, seed=a.seed)
    results, out = run_configs(a, configs, a.tokenizer or Path(target), "mixed-traffic", shape)
    results["mixed_comparison"] = traffic.comparison(results)
    out.write_text(json.dumps(results, indent=1))
    print()
    print(traffic.format_comparison(results["mixed_comparison"]))
    return 0

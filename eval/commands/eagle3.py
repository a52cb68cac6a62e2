"""`python -m eval eagle3`: the EAGLE-3 comparison. AR, STANDALONE, SGLang's EAGLE3 with our
head, SSD with the 0.5B draft, SSD with the head, all on both cores (`eval.eagle3_bench`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import configs as presets
from eval import eagle3_bench
from eval.cli_options import BadInput
from eval.commands.interleaved import add_compare_options, compare
from eval.commands.run_args import add_run_options, target_and_draft_cpus
from eval.sampling import Sampling

HELP = "AR vs STANDALONE vs EAGLE3 vs SSD (0.5B draft) vs SSD (EAGLE-3 head)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The run's options, the comparison's and the head folder."""
    add_run_options(p)
    add_compare_options(p, "e.g. AR-2c,EAGLE3-2c,SSD-HEAD-1+1c")
    p.add_argument(
        "--head",
        type=Path,
        help="EAGLE-3 head folder (default: the one `python -m sglang_ssd.models build eagle3` "
        "stored in the model cache)",
    )
    p.set_defaults(prompts=4, max_new_tokens=64, repeats=1)


def run(a: argparse.Namespace) -> int:
    """Run the comparison; eval/results/eagle3-b<B>-<sampling>.json.

    Raises:
        BadInput: no `--head` and no head in the model cache.
    """
    target_cpu, draft_cpu = target_and_draft_cpus(a)
    target, draft = presets.model_dirs(a.target, a.draft)
    try:
        head = a.head or eagle3_bench.default_head(target)
    except FileNotFoundError as exc:
        raise BadInput(str(exc)) from exc
    configs = eagle3_bench.bench_configs(
        target, draft, head, lookahead=a.lookahead, target_cpu=target_cpu, draft_cpu=draft_cpu
    )
    name = f"eagle3-b{a.batch_size}-{Sampling.of(a.temperature).name}"
    return compare(a, configs, Path(target), name, eagle3_bench.comparisons)

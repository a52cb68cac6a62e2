"""Running configurations interleaved on a prompt set (`run_configs`), and the comparison
benchmarks built on it (`compare`: `ssd`, `eagle3`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eval import cli_options, datasets, mixed, ssd_bench
from eval.cli_options import BadInput
from eval.commands.run_args import (
    LOGS,
    QUICK_PROMPTS,
    QUICK_TOKENS,
    RESULTS,
    comma_list,
    mtbench_answers_of,
    settings_of,
)
from eval.configs import Config
from eval.harness import run_interleaved
from eval.summary import format_table


def add_compare_options(p: argparse.ArgumentParser, only_example: str) -> None:
    """The options of the comparison benchmarks (`ssd`, `eagle3`): CPUs, γ, a subset of the
    configurations, the model folders."""
    cli_options.add_cpus(p)
    cli_options.add_lookahead(p)
    p.add_argument(
        "--only",
        type=comma_list,
        default=[],
        metavar="NAMES",
        help="comma-separated configurations to run, in this order (the first is the reference), "
        + only_example,
    )
    cli_options.add_pair(p)


def _prompts_and_dataset(
    a: argparse.Namespace, tokenizer: Any, tokenizer_dir: Path
) -> tuple[list, dict]:
    """The prompts `--dataset`/`--prompts`/`--prompt-ids` name, and the results' dataset keys.

    Raises:
        BadInput: an unknown prompt id, a set that cannot be read, or second turns without
            their answers.
    """
    answers = mtbench_answers_of(a, tokenizer_dir)
    try:
        prompts = datasets.load_prompts(
            a.dataset,
            tokenizer,
            a.prompts,
            a.prompt_ids,
            answers=None if answers is None else answers.answers,
        )
    except datasets.UnansweredError as exc:
        assert answers is not None
        raise BadInput(f"{exc} (with --out {answers.path})") from exc
    except datasets.DatasetError as exc:
        raise BadInput(str(exc)) from exc
    sources = {d: datasets.source_info(d) for d in datasets.sets_of(a.dataset)}
    dataset = {
        "dataset": a.dataset,
        "dataset_source": sources.popitem()[1] if len(sources) == 1 else sources,
        **({} if answers is None else {"mtbench_turn": 2, "mtbench_answers": answers.describe()}),
    }
    return prompts, dataset


def run_configs(
    a: argparse.Namespace,
    configs: Sequence[Config],
    tokenizer_dir: Path,
    name: str,
    mixed_shape: mixed.MixedShape | None = None,
) -> tuple[dict, Path]:
    """Run `configs` interleaved on the prompts `a` names (or `mixed_shape`'s draw), print the
    table and return (the results document, its path: `--out` or eval/results/<name>.json)."""
    if a.quick:
        a.prompts, a.max_new_tokens = min(a.prompts, QUICK_PROMPTS), QUICK_TOKENS
    out: Path = a.out or RESULTS / f"{name}{'-quick' if a.quick else ''}.json"
    log_dir: Path = a.log_dir or LOGS / out.stem
    tokenizer = datasets.load_tokenizer(tokenizer_dir)
    settings = settings_of(a)
    if mixed_shape is None:
        prompts, dataset = _prompts_and_dataset(a, tokenizer, tokenizer_dir)
    else:
        prompts, sizes = mixed.load_mixed(tokenizer, mixed_shape)
        settings = dataclasses.replace(settings, unit_sizes=sizes)
        dataset = {
            "dataset": "mixed",
            "dataset_source": {d: datasets.source_info(d) for d in datasets.DATASETS},
            "mixed_shape": dataclasses.asdict(mixed_shape),
        }
    metadata = {
        "name": name,
        "command": [sys.executable, "-m", "eval", *sys.argv[1:]],
        **dataset,
        "tokenizer": str(tokenizer_dir),
        "quick": a.quick,
    }
    print(
        f"{len(configs)} configs x {len(prompts)} {dataset['dataset']} prompts x "
        f"{a.max_new_tokens if mixed_shape is None else 'mixed'} tokens, "
        f"{len(settings.units(len(prompts)))} units, {a.repeats} repeat(s) -> {out}",
        flush=True,
    )
    results = run_interleaved(
        configs,
        prompts,
        settings,
        log_dir=log_dir,
        out_path=out,
        metadata=metadata,
        progress=lambda s: print(s, flush=True),
        resume=a.resume,
    )
    print()
    print(format_table(results))
    print(f"\nwrote {out}")
    return results, out


def compare(
    a: argparse.Namespace,
    configs: list[Config],
    target: Path,
    name: str,
    comparisons: Callable[[dict], list[dict]],
) -> int:
    """Run a comparison benchmark's `configs` (the `--only` ones, in that order), then add and
    print its `comparisons` (speedups with intervals) to the results file.

    Raises:
        BadInput: an `--only` name that is not one of `configs`.
    """
    if a.only:
        try:
            configs = ssd_bench.select(configs, a.only)
        except ValueError as exc:
            raise BadInput(f"--only: {exc}") from exc
    results, out = run_configs(a, configs, a.tokenizer or target, name)
    rows = comparisons(results)
    results["ssd_comparisons"] = rows
    out.write_text(json.dumps(results, indent=1))
    print()
    print(ssd_bench.format_comparisons(rows))
    return 0

"""`python -m eval run`: any configurations from a JSON file (a list of `Config` objects) on a
prompt set."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import configs as presets
from eval.commands.interleaved import run_configs
from eval.commands.run_args import add_run_options
from sglang_ssd.launch_server import flag_value

HELP = "configurations from a JSON file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The run's options, the configurations file and the run's name."""
    add_run_options(p)
    p.add_argument("--configs", type=Path, required=True, help="JSON list of configurations")
    p.add_argument("--name", help="experiment name (default: the configs file's stem)")


def run(a: argparse.Namespace) -> int:
    """Run the file's configurations; eval/results/<name>.json."""
    configs = presets.load_configs(a.configs)
    tokenizer = a.tokenizer
    if tokenizer is None:
        model = flag_value(configs[0].args, "--model-path")
        tokenizer = Path(model) if model else presets.default_model_dirs()[0]
    run_configs(a, configs, tokenizer, a.name or Path(a.configs).stem)
    return 0

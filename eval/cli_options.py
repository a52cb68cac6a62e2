"""Command-line options the eval tools share, declared once: the model pair, the CPUs, γ and
extra SSD flags (`python -m eval`'s subcommands, `eval.trace`, `eval.bench_speculator`,
`eval.margin`, `eval.lossless`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from sglang_ssd.config import DEFAULT_LOOKAHEAD, parse_cpu_list


def add_pair(parser: argparse.ArgumentParser) -> None:
    """`--target` and `--draft`: model folders (None: the pulled 1.5B and 0.5B)."""
    parser.add_argument("--target", type=Path, help="target model folder (default: the 1.5B)")
    parser.add_argument("--draft", type=Path, help="draft model folder (default: the 0.5B)")


def add_cpus(
    parser: argparse.ArgumentParser,
    default: Sequence[int] = (0, 1),
    help: str = "target CPU, draft CPU (default 0,1)",
) -> None:
    """`--cpus`: a CPU list (`0,1`, `0-3`)."""
    parser.add_argument("--cpus", type=parse_cpu_list, default=tuple(default), help=help)


def add_lookahead(parser: argparse.ArgumentParser, help: str = "γ for every config") -> None:
    """`--lookahead` (alias `--gamma`): γ, default the launcher's."""
    parser.add_argument("--lookahead", "--gamma", type=int, default=DEFAULT_LOOKAHEAD, help=help)


def add_ssd_args(parser: argparse.ArgumentParser) -> None:
    """`--ssd-args`: extra `--ssd-*` launcher flags for the SSD servers, one string."""
    parser.add_argument("--ssd-args", default="", help="extra --ssd-* flags for the SSD servers")

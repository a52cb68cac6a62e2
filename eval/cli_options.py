"""Command-line options the eval tools share, declared once: the model pair, the CPUs, γ, extra
SSD flags and the draft runtime (`python -m eval`'s subcommands, `eval.trace`,
`eval.bench_speculator`, `eval.margin`, `eval.lossless`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_ssd.config import DEFAULT_DRAFT_VOCAB, DEFAULT_LOOKAHEAD
from sglang_ssd.launch.cpu_lists import CpuListError, parse_cpu_list
from sglang_ssd.runtime_registry import AUTO, NAMES

if TYPE_CHECKING:
    from sglang_ssd.speculator.runtimes import DraftRuntime


class BadInput(ValueError):
    """A command line the eval tools cannot run: `python -m eval` reports it as argparse reports
    a bad flag (``python -m eval CMD: error: ...``, exit status 2)."""


def cpu_list(text: str) -> tuple[int, ...]:
    """A `--cpus` value (an argparse type): the CPU ids of a Linux CPU list ("0,1", "0-3")."""
    try:
        return parse_cpu_list(text)
    except CpuListError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


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
    parser.add_argument("--cpus", type=cpu_list, default=tuple(default), help=help)


def add_lookahead(parser: argparse.ArgumentParser, help: str = "γ for every config") -> None:
    """`--lookahead` (alias `--gamma`): γ, default the launcher's."""
    parser.add_argument("--lookahead", "--gamma", type=int, default=DEFAULT_LOOKAHEAD, help=help)


def add_ssd_args(parser: argparse.ArgumentParser) -> None:
    """`--ssd-args`: extra `--ssd-*` launcher flags for the SSD servers, one string."""
    parser.add_argument("--ssd-args", default="", help="extra --ssd-* flags for the SSD servers")


def add_draft_runtime(parser: argparse.ArgumentParser) -> None:
    """`--draft-runtime`: what runs the draft's forwards, as the server's `--ssd-draft-runtime`
    (default auto: the server's default on this machine)."""
    parser.add_argument(
        "--draft-runtime", choices=NAMES, default=AUTO, help="as --ssd-draft-runtime (default auto)"
    )


def add_draft_vocab(parser: argparse.ArgumentParser, default: int = DEFAULT_DRAFT_VOCAB) -> None:
    """`--draft-vocab N`: the draft vocabulary's size, as the server's `--ssd-draft-vocab`
    (default: the server's; 0 keeps every id)."""
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=default,
        help=f"as --ssd-draft-vocab (default {default}; 0: every id)",
    )


def load_draft(
    draft: str | Path, runtime: str, kv_slots: int, draft_vocab: int = 0
) -> DraftRuntime:
    """The draft runtime `runtime` of the folder `draft` on the CPU, as the speculator builds it
    (bf16 where the runtime has a dtype; `kv_slots` pool tokens, at most half the free memory),
    restricted to the `draft_vocab` most frequent ids when nonzero (`--ssd-draft-vocab`).

    Raises:
        ValueError: a runtime that cannot load the folder (`speculator.runtimes.resolve`).
    """
    from sglang_ssd.runtime_registry import LoadRequest
    from sglang_ssd.speculator import draft_vocab as vocabs
    from sglang_ssd.speculator.runtimes import create_draft_runtime

    request = LoadRequest(str(draft), None, "cpu", "bfloat16", kv_slots, 0.5)
    model = create_draft_runtime(runtime, request)
    if draft_vocab:
        vocabs.install(model, draft, draft_vocab)
    return model

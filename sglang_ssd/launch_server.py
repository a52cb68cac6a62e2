"""`python -m sglang_ssd.launch_server`: SGLang's launch_server with SSD's flags and CPU defaults.

Every flag that is not `--ssd-*` goes to SGLang untouched. On top of SGLang's defaults it:
- serves the real Qwen2.5-Coder pair when no `--model-path` is given (pulled if absent: the 1.5B
  target, and the 0.5B draft for STANDALONE and SSD);
- on a machine without CUDA selects SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE=1`,
  `--device cpu`, the `intel_amx` attention backend that speculative decoding needs on CPU, and
  a bounded `--max-total-tokens`, and `--sleep-on-idle`);
- drops `--speculative-algorithm NONE`: SGLang 0.5.23 treats the string "NONE" as speculative in
  its tokenizer manager and crashes on the first finished request;
- validates the `--ssd-*` flags into one `SSDConfig` and exports it to SGLang's subprocesses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_ssd.config import DEFAULT_LOOKAHEAD, SSDConfig, SSDConfigError, add_ssd_args

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

DEFAULT_ALGORITHM = "SSD"
CPU_MAX_TOTAL_TOKENS = 32768
# Algorithms that need a draft model path.
DRAFT_ALGORITHMS = ("STANDALONE", "SSD")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in `argv` (``--flag v`` or ``--flag=v``); the last one wins."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


flag_value = _flag_value  # public: eval reads the launcher's flags the launcher's way


def _without_flag(argv: Sequence[str], flag: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return out


def split_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Separate the `--ssd-*` flags (parsed) from SGLang's (returned untouched, in order).

    Raises:
        SystemExit: with argparse's message on a malformed `--ssd-*` value or an unknown
            `--ssd-*` flag (exit status 2).
    """
    parser = argparse.ArgumentParser(
        prog="python -m sglang_ssd.launch_server", add_help=False, allow_abbrev=False
    )
    add_ssd_args(parser)
    ssd_ns, rest = parser.parse_known_args(list(argv))
    unknown = [a.split("=", 1)[0] for a in rest if a.startswith("--ssd-")]
    if unknown:
        parser.error(f"unknown SSD flag(s): {', '.join(unknown)} (see --help)")
    return ssd_ns, rest


def apply_defaults(argv: list[str], *, cuda: bool, environ: dict[str, str]) -> list[str]:
    """Return SGLang's argv with sglang-ssd's defaults added where the user gave none.

    Also sets `SGLANG_USE_CPU_ENGINE=1` in `environ` on machines without CUDA.
    """
    argv = list(argv)
    algorithm = (_flag_value(argv, "--speculative-algorithm") or DEFAULT_ALGORITHM).upper()
    argv = _without_flag(argv, "--speculative-algorithm")
    if algorithm != "NONE":
        argv += ["--speculative-algorithm", algorithm]

    if _flag_value(argv, "--model-path") is None:
        from sglang_ssd.models import TARGET_MODEL, model_path

        argv += ["--model-path", str(model_path(TARGET_MODEL, pull=True))]
    if algorithm in DRAFT_ALGORITHMS:
        if _flag_value(argv, "--speculative-draft-model-path") is None:
            from sglang_ssd.models import DRAFT_MODEL, model_path

            argv += ["--speculative-draft-model-path", str(model_path(DRAFT_MODEL, pull=True))]
        steps = _flag_value(argv, "--speculative-num-steps")
        if steps is None:
            argv += ["--speculative-num-steps", str(DEFAULT_LOOKAHEAD)]
            steps = str(DEFAULT_LOOKAHEAD)
        if _flag_value(argv, "--speculative-eagle-topk") is None:
            argv += ["--speculative-eagle-topk", "1"]
        if _flag_value(argv, "--speculative-num-draft-tokens") is None:
            argv += ["--speculative-num-draft-tokens", str(int(steps) + 1)]

    if not cuda:
        environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        if _flag_value(argv, "--device") is None:
            argv += ["--device", "cpu"]
        if _flag_value(argv, "--attention-backend") is None:
            argv += ["--attention-backend", "intel_amx"]
        if _flag_value(argv, "--max-total-tokens") is None:
            argv += ["--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS)]
        if "--sleep-on-idle" not in argv:
            # An idle CPU scheduler otherwise busy-polls a whole core, which slows a speculator
            # or another server sharing the machine.
            argv.append("--sleep-on-idle")
    return argv


def build_config(ssd_ns: argparse.Namespace, sglang_argv: Sequence[str]) -> SSDConfig:
    """The validated `SSDConfig`, with γ copied from `--speculative-num-steps`."""
    steps = _flag_value(sglang_argv, "--speculative-num-steps")
    try:
        lookahead = int(steps) if steps is not None else DEFAULT_LOOKAHEAD
    except ValueError as exc:
        raise SSDConfigError(f"--speculative-num-steps must be an integer, got {steps!r}") from exc
    return SSDConfig.from_namespace(ssd_ns, lookahead=lookahead)


def _prepare_draft_vocab(config: SSDConfig, sglang_argv: Sequence[str]) -> None:
    """Count the reduced draft vocabulary now, once per tokenizer (cached; on a miss the build
    tool runs in a subprocess, `draft_vocab.load_or_build`), so that the speculator starts
    without the tens of seconds it takes (`--ssd-draft-vocab`).

    Raises:
        SystemExit: when the draft is not a local folder (a Hub id: nothing to count from).
    """
    draft = _flag_value(sglang_argv, "--speculative-draft-model-path")
    algorithm = (_flag_value(sglang_argv, "--speculative-algorithm") or "").upper()
    if not config.draft_vocab or draft is None or algorithm != DEFAULT_ALGORITHM:
        return
    if not Path(draft).is_dir():
        sys.exit(
            f"error: --speculative-draft-model-path {draft} is not a local folder: SSD's "
            "speculator loads the draft and counts its vocabulary from a folder (download it "
            "first, e.g. `python -m sglang_ssd.models pull` for the real pair), or pass "
            "--ssd-draft-vocab 0"
        )
    from sglang_ssd.speculator.draft_vocab import for_model

    for_model(draft, config.draft_vocab)


def _print_help() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_ssd.launch_server",
        description="SGLang's launch_server with Speculative Speculative Decoding (SSD/Saguaro). "
        "All of SGLang's flags are accepted; the --ssd-* flags are listed first.",
        add_help=False,
    )
    add_ssd_args(parser)
    parser.print_help()
    print("\n--- SGLang's flags (passed through) ---\n")
    from sglang.srt.server_args import ServerArgs

    sglang_parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(sglang_parser)
    sglang_parser.print_help()


def server_args_of(argv: Sequence[str], *, fork_start: bool = False) -> ServerArgs:
    """What `main` serves for `argv`: parse, apply defaults, export `SSDConfig` (to this
    process's environment, for SGLang's subprocesses), with `fork_start` on a machine without
    CUDA start the preloading forkserver (`sglang_ssd.launch.fork_start`, unless
    `SGLANG_SSD_FORKSERVER=0`), load SGLang's plugins, then SGLang's own
    `prepare_server_args`. The result is raw, as SGLang returns it: `run_server` resolves it
    first (`ServerArgs.resolve_once`), which runs SSD's `validate_ssd_server_args` through the
    speculative registry and raises ValueError naming a flag SSD refuses.

    Raises:
        SystemExit: on a malformed `--ssd-*` flag or an invalid SSD configuration.
    """
    ssd_ns, sglang_argv = split_args(argv)
    cuda = _has_cuda()
    try:
        sglang_argv = apply_defaults(sglang_argv, cuda=cuda, environ=os.environ)
        config = build_config(ssd_ns, sglang_argv)
    except SSDConfigError as exc:
        sys.exit(f"error: {exc}")
    config.to_env()
    if fork_start and not cuda:
        from sglang_ssd.launch import fork_start as forks

        if forks.enabled_by(os.environ):
            forks.enable()  # its imports run beside this process's from here on
    _prepare_draft_vocab(config, sglang_argv)

    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    return prepare_server_args(sglang_argv)


def start_speculator_zygote(argv: Sequence[str], environ: MutableMapping[str, str]) -> int | None:
    """On a machine without CUDA, for SSD (the default algorithm), fork the speculator zygote
    (`sglang_ssd.launch.zygote_process.fork_speculator_zygote`) and name its socket in `environ`
    (`SGLANG_SSD_SPECULATOR_ZYGOTE`, which SGLang's children inherit): the speculator's
    imports then run beside the target's start-up, and each speculator is forked with them
    done. Call it first thing: this process must not have run torch on several threads yet.
    Returns the zygote's pid, or None when not started (CUDA, another algorithm, or
    `SGLANG_SSD_SPECULATOR_FORK=0`)."""
    from sglang_ssd.launch import zygote, zygote_process

    algorithm = (_flag_value(argv, "--speculative-algorithm") or DEFAULT_ALGORITHM).upper()
    if algorithm != "SSD" or environ.get(zygote.SPECULATOR_SWITCH, "1") == "0" or _has_cuda():
        return None
    pid, address = zygote_process.fork_speculator_zygote()
    environ[zygote.SPECULATOR_ADDRESS_ENV] = address
    return pid


def main(argv: Sequence[str] | None = None) -> None:
    """`server_args_of(argv)`, then run SGLang's server in this process (on CPU with the
    speculator zygote forked first: `start_speculator_zygote`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        _print_help()
        return
    start_speculator_zygote(argv, os.environ)
    server_args = server_args_of(argv, fork_start=True)

    from sglang.launch_server import run_server
    from sglang.srt.utils import kill_process_tree

    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()

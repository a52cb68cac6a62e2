"""`python -m eval`: the evaluation harness's command line, one subcommand per module of
`eval.commands` (and of `eval.margin`, `eval.outcomes`, `eval.target_split`, `eval.options_cost`).
`python -m eval CMD --help` describes each. Every bad input ends the same way, as argparse ends a
bad flag: the usage line, ``python -m eval CMD: error: <what is wrong>``, exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import NamedTuple

from eval import options_cost, outcomes, target_split
from eval.commands import (
    all_experiments,
    baseline,
    eagle3,
    figures,
    mixed,
    model,
    report,
    run,
    show,
    ssd,
    sweep,
)
from eval.margin import cli as margin

PROG = "python -m eval"


class Command(NamedTuple):
    """One subcommand: its help line, what declares its options, what runs it (None: its own
    sub-subcommands set `func`), and the module whose docstring describes it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int] | None
    doc: ModuleType


def _of(module: ModuleType) -> Command:
    return Command(module.HELP, module.add_arguments, module.run, module)


COMMANDS: dict[str, Command] = {
    "baseline": _of(baseline),
    "ssd": _of(ssd),
    "eagle3": _of(eagle3),
    "mixed": _of(mixed),
    "run": _of(run),
    "show": _of(show),
    "sweep": _of(sweep),
    "figures": _of(figures),
    "report": _of(report),
    "all": _of(all_experiments),
    "model": _of(model),
    "margin": Command(
        "measure ε of the greedy rule on the real pair", margin.add_arguments, margin.run, margin
    ),
    "outcomes": Command(
        "record rounds, replay fan-out allocations on them", outcomes.add_arguments, None, outcomes
    ),
    "target-split": Command(
        "where the target's forward goes (in SGLang, CPU)",
        target_split.add_arguments,
        target_split.run,
        target_split,
    ),
    "options": Command(
        "what each request option costs SSD (tok/s ratio)",
        options_cost.add_arguments,
        options_cost.cli,
        options_cost,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """`python -m eval`'s parser: one subparser per `COMMANDS` entry, each remembering itself
    (``_parser``) so that a bad input found later is reported as argparse reports a bad flag."""
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=command.help,
            description=command.doc.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(p)
        p.set_defaults(_parser=p)
        if command.run is not None:
            p.set_defaults(func=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` and run its subcommand; its exit status.

    A bad input (argparse's, `BadInput` and other ValueErrors, a missing file, or a
    ``SystemExit("message")`` of a subcommand's own) exits with status 2 and
    ``python -m eval CMD: error: message``.
    """
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # e.g. why a figure is skipped
    # SIGTERM must unwind like Ctrl-C, so that the servers' context managers stop them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return a.func(a)
    except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        a._parser.error(_message(exc))
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        a._parser.error(exc.code)
    raise AssertionError("unreachable: argparse's error exits")


def _message(exc: BaseException) -> str:
    """An exception as one line: an OSError's reason and file name, else its text."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror}: {exc.filename}"
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())

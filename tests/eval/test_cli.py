"""Every command line of `eval` answers `--help` (its imports resolve and its parser builds)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from eval.__main__ import COMMANDS as EVAL_COMMANDS
from eval.__main__ import main

EVAL_SUBCOMMANDS = (
    "baseline", "ssd", "eagle3", "mixed", "run", "show", "sweep", "figures", "report", "all",
    "model", "margin", "outcomes", "target-split", "options",
)  # fmt: skip
# (module whose `main` parses the command line, the arguments after `python -m <package>`)
COMMANDS = [
    ("eval.__main__", ["--help"]),
    *(("eval.__main__", [sub, "--help"]) for sub in EVAL_SUBCOMMANDS),
    ("eval.trace.__main__", ["--help"]),
    ("eval.trace.__main__", ["record", "--help"]),
    ("eval.trace.__main__", ["replay", "--help"]),
    ("eval.bench_speculator.__main__", ["--help"]),
    ("eval.bench_verify", ["--help"]),
    ("eval.lossless", ["--help"]),
    ("eval.mtbench_answers", ["--help"]),
    ("eval.margin.__main__", ["--help"]),
    ("eval.load", ["--help"]),
    ("eval.distribution.__main__", ["--help"]),
    ("eval.distribution.__main__", ["power", "--help"]),
    ("eval.distribution.__main__", ["run", "--help"]),
]


@pytest.mark.parametrize(("module", "argv"), COMMANDS, ids=[" ".join([m, *a]) for m, a in COMMANDS])
def test_help(module: str, argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        importlib.import_module(module).main(argv)
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m ")


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--ssd-runtimes", "torch,nope", "unknown or no draft runtime(s) ['nope']"),
        ("--ssd-runtimes", "", "unknown or no draft runtime(s) []"),
        ("--standalone-gammas", "3,x", "not comma-separated integers"),
        ("--standalone-gammas", "", "needs one or more integers >= 1, got ''"),
        ("--standalone-gammas", "3,0", "needs one or more integers >= 1, got '3,0'"),
        ("--prompt-ids", None, "argument --prompt-ids: expected at least one argument"),
    ],
)
def test_eval_ssd_refuses_bad_lists_at_parse_time(
    flag: str, value: str | None, message: str, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """A bad or empty name, γ or prompt-id list fails before any server starts (exit status 2,
    argparse's; an empty list once ran the whole default benchmark, and `--prompt-ids` with no
    ids still did for a new user). Were it accepted, the one CPU given stops the command at once
    with another exit status (no server, no results file)."""
    given = [] if value is None else [value]
    argv = ["ssd", flag, *given, "--cpus", "0", "--out", str(tmp_path / "never.json")]
    with pytest.raises(SystemExit) as done:
        importlib.import_module("eval.__main__").main(argv)
    assert done.value.code == 2
    assert message in capsys.readouterr().err


def test_every_subcommand_is_listed_here() -> None:
    assert set(EVAL_SUBCOMMANDS) == set(EVAL_COMMANDS)


# `python -m eval` refuses each of these before anything starts, argparse's way.
ERROR_LINE = re.compile(r"^python -m eval( [a-z0-9-]+)*: error: \S.*$")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope"], "invalid choice: 'nope'"),  # an unknown subcommand (argparse)
        (["ssd", "--cpus", "x"], "argument --cpus: 'x' is not a CPU id or range"),
        (["ssd", "--cpus", "0"], "--cpus needs exactly two CPUs (target, draft), got [0]"),
        (["show", "{missing}"], "No such file or directory: {missing}"),
        (["show", "{not_json}"], "{not_json}: not JSON"),
        (["model", "--components", "{missing}", "--target", "{missing}"], "No such file"),
        (["outcomes", "replay", "{not_trace}"], "not an `eval outcomes record` trace"),
        (
            ["ssd", "--only", "NOPE", "--target", "{missing}", "--draft", "{missing}"],
            "--only: unknown configuration(s) ['NOPE']",
        ),
    ],
)
def test_every_bad_input_ends_the_same_way(
    argv: list[str], message: str, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """An unknown subcommand, a bad flag value, a missing or unreadable file and the
    subcommands' own refusals: exit status 2, the usage line, then one
    ``python -m eval CMD: error: ...`` line (no traceback)."""
    paths = {"missing": tmp_path / "missing.json", "not_json": tmp_path / "not.json"}
    paths["not_trace"] = tmp_path / "trace.json"
    paths["not_json"].write_text("{")
    paths["not_trace"].write_text("{}")
    argv = [a.format(**paths) for a in argv]
    if argv[0] == "ssd":  # were it to run after all: no results or logs in the repository
        argv += ["--out", str(tmp_path / "never.json"), "--log-dir", str(tmp_path / "logs")]
    message = message.format(**paths)
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2 and not (tmp_path / "never.json").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("usage: python -m eval"), err
    assert ERROR_LINE.match(err[-1]) and message in err[-1], err

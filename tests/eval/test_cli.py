"""Every command line of `eval` answers `--help` (its imports resolve and its parser builds)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

EVAL_SUBCOMMANDS = (
    "baseline", "ssd", "run", "show", "sweep", "figures", "report", "all", "margin", "options",
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

"""`sglang_ssd.launch.cpu_lists`: the Linux CPU-list form, read and written back."""

from __future__ import annotations

import argparse

import pytest

from sglang_ssd.config import add_ssd_args
from sglang_ssd.launch.cpu_lists import CpuListError, format_cpu_list, parse_cpu_list


@pytest.mark.parametrize(
    ("text", "expected"), [("1", (1,)), ("0-3", (0, 1, 2, 3)), ("3,1-2", (1, 2, 3))]
)
def test_cpu_lists(text: str, expected: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == expected


@pytest.mark.parametrize("text", ["", "a", "3-1", "1,,2", "-1"])
def test_bad_cpu_lists(text: str) -> None:
    with pytest.raises(CpuListError):
        parse_cpu_list(text)


def test_format_reads_back() -> None:
    assert format_cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert parse_cpu_list(format_cpu_list([5, 0, 1, 2, 7, 8])) == (0, 1, 2, 5, 7, 8)


def test_the_flag_names_itself_once(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse names `--ssd-draft-cpus`; the reason follows without a second prefix."""
    parser = argparse.ArgumentParser()
    add_ssd_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--ssd-draft-cpus", "3-1"])
    err = capsys.readouterr().err
    assert "argument --ssd-draft-cpus: range '3-1' is reversed" in err

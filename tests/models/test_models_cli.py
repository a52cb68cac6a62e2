"""Argument handling of `python -m sglang_ssd.models`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sglang_ssd.models.cli as cli
from sglang_ssd.models import DRAFT_MODEL, MODELS, TARGET_MODEL, store

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SGLANG_SSD_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def pulled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    monkeypatch.setattr(cli, "pull", names.append)
    return names


@pytest.mark.parametrize("argv", [[], ["pull"], ["pull", "llama-7b"], ["fetch", TARGET_MODEL]])
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_unknown_name_error_lists_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["pull", "llama-7b"])
    err = capsys.readouterr().err
    assert "invalid choice: 'llama-7b'" in err
    assert TARGET_MODEL in err and DRAFT_MODEL in err and "all" in err


def test_pull_all_pulls_every_model_in_order(pulled: list[str]) -> None:
    assert cli.main(["pull", "all", "--jobs", "1"]) == 0
    assert pulled == list(MODELS)


def test_pull_names_once_each(pulled: list[str]) -> None:
    assert cli.main(["pull", DRAFT_MODEL, DRAFT_MODEL, "--jobs", "1"]) == 0
    assert pulled == [DRAFT_MODEL]


def test_pull_failure_exits_1(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def broken(name: str) -> None:
        raise RuntimeError("index unreachable")

    monkeypatch.setattr(cli, "pull", broken)
    assert cli.main(["pull", TARGET_MODEL, "--jobs", "1"]) == 1
    assert f"pulling {TARGET_MODEL} failed: index unreachable" in capsys.readouterr().err


def test_pull_side_by_side_runs_each_model_in_its_own_process(
    empty_home: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    # Both models present (their markers name the pinned GGUFs): each spawned child finds its
    # own and says so. The parent's `pull` is broken here, and no child sees that patch.
    monkeypatch.setattr(cli, "pull", lambda name: (_ for _ in ()).throw(RuntimeError("parent")))
    for spec in MODELS.values():
        folder = store.model_dir(spec)
        folder.mkdir(parents=True)
        marker = {"format": store.MARKER_FORMAT, "gguf_sha256": spec.gguf_sha256}
        (folder / store.MARKER_NAME).write_text(json.dumps(marker))
    assert cli.main(["pull", "all", "--jobs", "2"]) == 0
    out = capfd.readouterr().out
    assert all(f"{name}: already present" in out for name in MODELS), out


def test_negative_jobs_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["pull", "all", "--jobs", "-1"]) == 2
    assert "--jobs must be 0" in capsys.readouterr().err


def test_list_shows_every_model_absent(empty_home: Path, capsys) -> None:
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(MODELS)
    for line, name in zip(lines, MODELS, strict=True):
        assert line.startswith(name) and "absent" in line
        assert str(empty_home / "models" / name) in line


def test_module_entry_point_exits_2_on_unknown_name(empty_home: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "sglang_ssd.models", "pull", "llama-7b"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "invalid choice: 'llama-7b'" in result.stderr

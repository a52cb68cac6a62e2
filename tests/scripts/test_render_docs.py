"""`scripts/render_docs.py`: the rendered parts of README.md, docs/flags.md and docs/stats.md
equal what the code declares, and a stale or missing part is caught."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import render_docs
from sglang_ssd.config import FLAGS

ROOT = Path(__file__).resolve().parents[2]


def test_rendered_parts_equal_the_code() -> None:
    stale = render_docs.render(check=True)
    assert not stale, f"run `python scripts/render_docs.py`: {stale}"


def test_check_reports_a_stale_part_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "docs").mkdir()
    for path in {path for path, _ in render_docs.PARTS}:
        shutil.copy(ROOT / path, tmp_path / path)
    monkeypatch.setattr(render_docs, "ROOT", tmp_path)
    before = (tmp_path / "docs" / "flags.md").read_text()
    parts = dict(render_docs.PARTS)
    parts[("docs/flags.md", "ssd-flags")] = lambda: "| a flag the code does not declare |"
    monkeypatch.setattr(render_docs, "PARTS", parts)
    assert render_docs.render(check=True) == ["docs/flags.md: ssd-flags"]
    assert (tmp_path / "docs" / "flags.md").read_text() == before
    assert render_docs.render() == ["docs/flags.md: ssd-flags"]  # rewrites the part
    assert render_docs.rendered_part("docs/flags.md", "ssd-flags") == (
        "| a flag the code does not declare |"
    )
    assert render_docs.render(check=True) == []
    (tmp_path / "docs" / "stats.md").write_text("no markers here\n")
    with pytest.raises(ValueError, match="no rendered part 'stats-keys'"):
        render_docs.render(check=True)


def test_every_flag_has_a_short_help_and_evidence() -> None:
    for flag in FLAGS.values():
        assert len(flag.help) <= render_docs.HELP_LIMIT, (flag.option, len(flag.help))
        assert flag.help.endswith("."), flag.option
        assert flag.evidence and "#" in flag.evidence, flag.option
        assert (ROOT / "docs" / flag.evidence.partition("#")[0]).is_file(), flag.evidence


def test_cli_check_exits_zero_when_fresh() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_docs.py"), "--check"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_readme_stays_a_front_page() -> None:
    """At most 150 lines, naming `make test` (.ci/run runs the README's test command)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, len(readme.splitlines())
    assert "make test " in readme

"""eval/results holds what the docs and the code cite, and an archive with a one-line index.

- Every results path the docs or the code name (`eval/results/NAME`, with `{a,b}` alternatives
  or a `*` pattern) exists; a name with `<placeholders>` or `[optional]` parts is a template.
- Every file in eval/results is cited there: by its path, by its bare name (`NAME.json`), by a
  pattern, inside a cited folder, from a cited Markdown file beside it (the report names its
  inputs and figures relatively), or as the gzipped batches of a cited run (`NAME.batches.json.gz`,
  `eval.results_io`). Or it is in eval/results/archive/, whose README.md names every file there
  on one line.

Read with the text only; tests are not citers (they build their own results).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "eval" / "results"
ARCHIVE = RESULTS / "archive"
INDEX = ARCHIVE / "README.md"
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".ini", ".cfg"}
TEXT_NAMES = {"Makefile"}
NOT_CITERS = ("tests/", "eval/results/", ".")
RESULT_SUFFIXES = r"json|md|png|gz|jsonl|csv"
# `eval/results/` then a path with `{a,b}` alternatives or `*`; a name followed by `<`, `[`, `$`,
# `%` or `…` is a template (its placeholders filled in by a run), not a file.
CITED_PATH = re.compile(r"eval/results/([\w.+,{}*/-]*[\w*}/])(?![\w.+,{}*/<\[$%…-])")
BARE_NAME = re.compile(rf"(?<![\w./+-])([\w+-][\w.+-]*\.(?:{RESULT_SUFFIXES}))(?![\w.+-])")
RELATIVE = re.compile(rf"(?<![\w./+-])((?:[\w.+-]+/)*[\w.+-]+\.(?:{RESULT_SUFFIXES}))(?![\w.+-])")
BATCHES = ".batches.json.gz"
# What the tools write by default and the repository does not keep (their help names them).
WRITTEN_BY_DEFAULT = frozenset({"report.md", "forward-split.json", "kernels.json", "startup.json"})


def repo_files() -> list[str]:
    """Tracked and untracked, not ignored files, relative to the root."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    return [p for p in out if p and (ROOT / p).is_file()]


def citers() -> list[str]:
    """The docs and the code: every text file but tests, results and hidden folders'."""
    return [
        p for p in repo_files()
        if (Path(p).suffix in TEXT_SUFFIXES or Path(p).name in TEXT_NAMES)
        and not p.startswith(NOT_CITERS)
    ]  # fmt: skip


def results_files() -> set[str]:
    """Every file under eval/results, relative to it."""
    return {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.is_file()}


def expand(pattern: str) -> list[str]:
    """Brace alternatives spelled out: ``a-{x,y}.json`` -> ``a-x.json``, ``a-y.json``."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [
        name
        for alternative in m.group(1).split(",")
        for name in expand(pattern[: m.start()] + alternative + pattern[m.end() :])
    ]


def _cut_at_comma(path: str) -> str:
    """A comma outside braces ends a path (``a.json,`` in a list)."""
    depth = 0
    for i, ch in enumerate(path):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            return path[:i]
    return path


def citations(files: set[str]) -> tuple[set[str], list[str]]:
    """(the results files cited, 'file:line: problem' for each cited path that does not exist)."""
    cited: set[str] = set()
    problems: list[str] = []

    def cite(rel: str, where: str) -> None:
        for name in expand(rel):
            name = name.rstrip("/")
            if "*" in name:
                cited.update(f for f in files if Path(f).match(name) or Path(f).match(f"{name}/*"))
            elif name in files:
                cited.add(name)
            elif (RESULTS / name).is_dir():
                cited.update(f for f in files if f.startswith(f"{name}/"))
            elif name not in WRITTEN_BY_DEFAULT:
                problems.append(f"{where}: eval/results/{name} does not exist")

    for source in citers():
        text = (ROOT / source).read_text(errors="replace")
        for m in CITED_PATH.finditer(text):
            cite(_cut_at_comma(m.group(1)), f"{source}:{text.count(chr(10), 0, m.start()) + 1}")
        cited.update(name for name in BARE_NAME.findall(text) if name in files)
    # Markdown inside eval/results (the report) cites its inputs and figures relatively, once
    # it is cited itself.
    done: set[str] = set()
    while todo := {f for f in cited if f.endswith(".md") and f not in done}:
        for md in todo:
            done.add(md)
            folder = Path(md).parent
            for rel in RELATIVE.findall((RESULTS / md).read_text(errors="replace")):
                name = str(folder / rel)
                if name in files:
                    cited.add(name)
    cited.update(f for f in files if f.endswith(BATCHES) and f"{f[: -len(BATCHES)]}.json" in cited)
    return cited, problems


def test_every_cited_results_file_exists() -> None:
    _, problems = citations(results_files())
    assert not problems, "\n".join(problems)


def test_every_results_file_is_cited_or_archived() -> None:
    files = results_files()
    cited, _ = citations(files)
    loose = sorted(f for f in files - cited if not f.startswith("archive/"))
    assert not loose, (
        "not cited by any doc or code (cite it, or `git mv` it to eval/results/archive/ with a "
        "line in archive/README.md, or `git rm` it):\n" + "\n".join(loose)
    )


def test_the_archive_index_names_each_archived_file_once() -> None:
    archived = {
        str(p.relative_to(ARCHIVE)) for p in ARCHIVE.rglob("*") if p.is_file() and p != INDEX
    }
    lines = [line for line in INDEX.read_text().splitlines() if line.startswith("- ")]
    indexed = [re.match(r"- `([^`]+)`", line) for line in lines]
    names = [m.group(1) for m in indexed if m]
    assert len(names) == len(lines), "each index line starts with - `NAME`"
    runs = {a for a in archived if not a.endswith(BATCHES)}  # batches go with their run
    assert sorted(names) == sorted(runs), (
        f"archived, not indexed: {sorted(runs - set(names))}; "
        f"indexed, not archived: {sorted(set(names) - runs)}"
    )

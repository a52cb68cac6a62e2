"""Every reference a reader can follow leads somewhere: repo paths, doc anchors, code symbols.

- A repo path named in code, docs or the README (`sglang_ssd/...`, `docs/...`, `tests/...`, ...)
  exists, and a `docs/<file>.md#anchor` names a heading of that file.
- A relative Markdown link in a `.md` file leads to a file that exists, and its `#anchor` to a
  heading there (anchors as GitHub renders them: `slug`).
- Every backticked code symbol in docs/architecture.md exists: a path, a module run with
  `python -m`, an `--ssd-*` flag (or SGLang's), an HTTP route, or a name (dotted or not) defined
  in the repository, in SGLang's source or importable.
- No file cites a project document that is not in the repository (the design notes live in
  docs/design.md).

Read with the text only, nothing imported but `sglang_ssd.config` (for the flag names).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".ini", ".cfg"}
TEXT_NAMES = {"Makefile"}
SKIPPED = ("eval/results/",)  # data, not prose
# What eval runs write (logs, data, results): a path there exists once a run has made it.
GENERATED = ("eval/results/", "eval/logs", "eval/data/")
# Strings shaped like repo paths that name none: examples in tests, a TCPStore key prefix.
NOT_PATHS = frozenset(
    {"tests/gpu/test_x.py", "tests/a/test_b.py", "tests/eval/test_x.py", "sglang_ssd/s/"}
)
PATTERN_CHARS = "*<{[$%"  # a path followed by one of these is a pattern, not a path
TOP_FOLDERS = "sglang_ssd|tests|eval|docs|scripts|kernels|requirements|patches"
# A repo path: a top folder, then path characters; not part of a longer path or a URL.
PATH = re.compile(rf"(?<![\w./-])((?:{TOP_FOLDERS})/[\w./-]*[\w/])(#[\w-]+)?")
MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
BACKTICKED = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
SYMBOL_DOCS = ("docs/architecture.md",)
# Project documents that are not in the repository; their content belongs in docs/.
MISSING_DOCS = re.compile(r"\b(?:DESIGN|STYLE)\.md\b|DESIGN notes|\.\./shared/")


@functools.cache
def repo_files() -> tuple[str, ...]:
    """Tracked and untracked, not ignored files (paths relative to the root, '/' separated);
    outside a git checkout, every file but hidden folders' and caches'."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.split("\n")  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        found = (p.relative_to(ROOT) for p in ROOT.rglob("*"))
        hidden = (".", "__pycache__")
        listed = [str(p) for p in found if not any(s.startswith(hidden) for s in p.parts)]
    return tuple(p for p in listed if p and (ROOT / p).is_file())


def text_files() -> list[str]:
    """The repository's prose and code (not data, not this file)."""
    me = str(Path(__file__).resolve().relative_to(ROOT))
    return [
        p for p in repo_files()
        if (Path(p).suffix in TEXT_SUFFIXES or Path(p).name in TEXT_NAMES)
        and not p.startswith(SKIPPED) and p != me
    ]  # fmt: skip


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: links and code marks dropped, lower case,
    punctuation but `-` and `_` removed, spaces to dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def anchors(md_path: str) -> frozenset[str]:
    """Every heading anchor of a Markdown file (GitHub numbers repeats: x, x-1, x-2)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in (ROOT / md_path).read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


@functools.cache
def sglang_folder() -> Path:
    """The installed SGLang package's folder."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin, "SGLang is not installed"
    return Path(spec.origin).parent


def path_problem(path: str, anchor: str | None) -> str | None:
    """Why `path` (relative to the root) with `anchor` (no '#') leads nowhere, or None. A path
    inside SGLang's package (`kernels/ops/...`, cited as SGLang's file) counts as existing, and
    so does a module's name written after its path (`tests/gpu/ssd_round.make_pair`)."""
    if not (ROOT / path).exists():
        if (sglang_folder() / path).exists() or (sglang_folder() / "srt" / path).exists():
            return None
        module, dot, _ = path.rpartition(".")  # `tests/gpu/ssd_round.make_pair`: a module's name
        if dot and (ROOT / f"{module}.py").is_file():
            return None
        return f"{path} does not exist"
    if anchor and path.endswith(".md") and anchor not in anchors(path):
        return f"{path} has no heading with anchor #{anchor}"
    return None


def _line(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def named_paths() -> list[str]:
    """'file:line: problem' for every repo path or docs anchor named that leads nowhere."""
    problems = []
    for name in text_files():
        text = (ROOT / name).read_text(errors="replace")
        for m in PATH.finditer(text):
            path, after = m.group(1), text[m.end() : m.end() + 1]
            if path in NOT_PATHS or path.startswith(GENERATED) or after in PATTERN_CHARS:
                continue
            problem = path_problem(path, (m.group(2) or "#")[1:] or None)
            if problem:
                problems.append(f"{name}:{_line(text, m.start())}: {problem}")
    return problems


def markdown_links() -> list[str]:
    """'file:line: problem' for every relative Markdown link that leads nowhere."""
    problems = []
    for name in text_files():
        if not name.endswith(".md"):
            continue
        text = (ROOT / name).read_text()
        for m in MD_LINK.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = ((ROOT / name).parent / file if file else ROOT / name).resolve()
            inside = path.is_relative_to(ROOT)
            problem = path_problem(
                str(path.relative_to(ROOT)) if inside else str(path), anchor or None
            )
            if problem:
                problems.append(f"{name}:{_line(text, m.start())}: link {target}: {problem}")
    return problems


@functools.cache
def defined_names() -> frozenset[str]:
    """Names the repository's Python defines: modules, classes, functions, methods, assigned
    names and attributes (`self.x = ...`), class fields."""
    names: set[str] = set()
    for name in repo_files():
        if not name.endswith(".py"):
            continue
        path = Path(name)
        names.update(path.parts[:-1])
        names.add(path.stem)
        try:
            tree = ast.parse((ROOT / name).read_text())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return frozenset(names)


@functools.cache
def sglang_names() -> frozenset[str]:
    """Classes and functions SGLang's installed source defines (a regex over the text: a
    symbol the docs name from SGLang only needs to be spelled right)."""
    source = "\n".join(p.read_text(errors="replace") for p in sglang_folder().rglob("*.py"))
    return frozenset(re.findall(r"(?:def|class)\s+(\w+)", source))


@functools.cache
def repo_source() -> str:
    """The repository's Python and packaging files, concatenated."""
    files = [p for p in repo_files() if p.endswith((".py", ".toml"))]
    return "\n".join((ROOT / p).read_text(errors="replace") for p in files)


def _name_exists(name: str) -> bool:
    return (
        name in defined_names()
        or f'"{name}"' in repo_source()  # a name the code spells as a string (a phase, a key)
        or name in sglang_names()
        or importlib.util.find_spec(name) is not None
    )


def _module_exists(module: str) -> bool:
    parts = module.split(".")
    for base in (ROOT, ROOT / "kernels"):
        folder = base.joinpath(*parts)
        if folder.with_suffix(".py").is_file() or (folder / "__init__.py").is_file():
            return True
    return False


@functools.cache
def ssd_flags() -> frozenset[str]:
    from sglang_ssd.config import FLAGS

    return frozenset(flag.option for flag in FLAGS.values())


def symbol_problem(symbol: str) -> str | None:
    """Why the backticked `symbol` of an architecture doc names nothing that exists, or None."""
    symbol = re.sub(r"\(.*\)$", "", symbol.strip())  # a call: `summary()`, `create(...)`
    if not symbol or "*" in symbol:
        return None  # a pattern (`--ssd-*`, `ssd_*`), not a name
    if symbol.startswith("python -m "):
        module = symbol.split()[2]
        return None if _module_exists(module) else f"no module {module}"
    if symbol.startswith("--"):  # ours, or SGLang's: a `ServerArgs` field, dashed
        flag = symbol.split()[0]
        fields = (sglang_folder() / "srt" / "arg_groups" / "field_order.py").read_text()
        sglang_flag = f'"{flag[2:].replace("-", "_")}"' in fields
        return None if flag in ssd_flags() or sglang_flag else f"no flag {flag}"
    if symbol.startswith("/"):  # an HTTP route
        return None if f'"{symbol}' in repo_source() else f"no route {symbol} in the code"
    if "/" in symbol or symbol.endswith(".py"):
        bases = ("", "sglang_ssd/", "kernels/", "kernels/sglang_ssd_kernels/")
        if any((ROOT / base / symbol).exists() for base in bases):
            return None
        if symbol.startswith("sglang/") and (sglang_folder().parent / symbol).exists():
            return None
        if "/" not in symbol and any(Path(p).name == symbol for p in repo_files()):
            return None
        return f"no file {symbol}"
    if DOTTED.fullmatch(symbol):
        missing = [part for part in symbol.split(".") if not _name_exists(part)]
        return f"{symbol}: {', '.join(missing)} not defined" if missing else None
    # anything else (a runtime or package name: `torch-int8`, `sglang-ssd-kernels`) is a string
    # the code or the packaging spells out
    if any(q in repo_source() for q in (f'"{symbol}"', f"'{symbol}'", f'"{symbol}-')):
        return None
    return f"{symbol} appears in no code or packaging file"


def test_named_repo_paths_and_anchors_exist() -> None:
    problems = named_paths()
    assert not problems, "\n".join(problems)


def test_markdown_links_lead_somewhere() -> None:
    problems = markdown_links()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", SYMBOL_DOCS)
def test_backticked_symbols_exist(doc: str) -> None:
    text = (ROOT / doc).read_text()
    problems = [
        f"{doc}:{_line(text, m.start())}: {problem}"
        for m in BACKTICKED.finditer(text)
        if (problem := symbol_problem(m.group(1)))
    ]
    assert not problems, "\n".join(problems)


def test_no_file_cites_a_document_outside_the_repository() -> None:
    problems = [
        f"{name}:{_line(text, m.start())}: {m.group(0)}"
        for name in text_files()
        for text in [(ROOT / name).read_text(errors="replace")]
        for m in MISSING_DOCS.finditer(text)
    ]
    assert not problems, "\n".join(problems)

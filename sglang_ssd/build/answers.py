"""Instructions derived from local Python sources, and the target's own answers to them.

EAGLE-3 trains on the target's responses (Li et al. 2025, §4: "we use the target model to
generate responses"), so the head learns what the target says, not what a corpus says. Each
instruction asks for a function of a training file (one with a docstring), by its name,
signature and the docstring's first paragraph; the target answers under its chat template.
Answers are appended to a JSON-lines file as they are generated, so an interrupted build keeps
them.
"""

from __future__ import annotations

import ast
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

MAX_DOC_CHARS = 400


def instructions(texts: Iterable[str]) -> Iterator[str]:
    """One instruction per documented top-level function of each parseable source text, in
    order: "Write a Python function `name(args)` that does the following: <docstring's first
    paragraph>" (functions without a docstring or named ``_*`` are skipped)."""
    for text in texts:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = (ast.get_docstring(node) or "").split("\n\n")[0].strip()
            if not doc:
                continue
            args = ast.unparse(node.args)
            yield (
                f"Write a Python function `{node.name}({args})` that does the following:\n"
                f"{doc[:MAX_DOC_CHARS]}"
            )


def chat_ids(tokenizer: Any, instruction: str) -> list[int]:
    """The instruction as one user turn under the tokenizer's chat template (generation
    prompt added), as token ids."""
    messages = [{"role": "user", "content": instruction}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return [int(t) for t in ids]


@torch.no_grad()
def generate_answers(
    target: torch.nn.Module,
    tokenizer: Any,
    prompts: Iterable[str],
    path: str | Path,
    seconds: float,
    max_new_tokens: int = 96,
) -> list[dict[str, Any]]:
    """The target's greedy answers, appended to `path` (JSON lines: instruction, prompt_len,
    ids = prompt + answer), until `seconds` are spent or the prompts run out. Then
    `path` + ".done" is written, and a later call (a resumed build) returns `path`'s records
    without generating more, so a resumed build trains on the same answers; an interrupted
    call's answers are kept and the rest of its budget is spent on the next call.

    Returns:
        Every record of `path` (earlier ones first).
    """
    path = Path(path)
    done = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    finished = Path(str(path) + ".done")
    if finished.exists():
        return done
    seen = {r["instruction"] for r in done}
    started = time.perf_counter()
    with path.open("a") as out:
        for instruction in prompts:
            if time.perf_counter() - started >= seconds:
                break
            if instruction in seen:
                continue
            prompt = chat_ids(tokenizer, instruction)
            ids = target.generate(
                torch.tensor([prompt]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )[0]
            record = {"instruction": instruction, "prompt_len": len(prompt), "ids": ids.tolist()}
            out.write(json.dumps(record) + "\n")
            out.flush()
            done.append(record)
            seen.add(instruction)
    finished.write_text("")
    return done

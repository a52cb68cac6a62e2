"""The real Qwen2.5-Coder pair and HumanEval prompts as token ids (test helper, `integration`)."""

from __future__ import annotations

from pathlib import Path

import requests

from eval.datasets import HUMANEVAL, load_prompts, load_tokenizer
from eval.servers import Server
from sglang_ssd.models import DRAFT_MODEL, TARGET_MODEL, model_path


def real_pair() -> tuple[Path, Path]:
    """(target, draft) model folders, pulled when absent."""
    return model_path(TARGET_MODEL, pull=True), model_path(DRAFT_MODEL, pull=True)


def humaneval_ids(target: Path, n: int) -> list[list[int]]:
    """The first `n` HumanEval prompts, tokenized by `target`'s tokenizer."""
    tokenizer = load_tokenizer(target)
    return [list(p.input_ids) for p in load_prompts(HUMANEVAL, tokenizer, n=n)]


def greedy(server: Server, prompts: list[list[int]], n: int) -> list[dict]:
    """`server`'s `/generate` responses to `prompts` (token ids), greedy, `n` new tokens each,
    one request at a time."""
    out = []
    for ids in prompts:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0}}
        r = requests.post(f"{server.url}/generate", json=body, timeout=900)
        r.raise_for_status()
        out.append(r.json())
    return out

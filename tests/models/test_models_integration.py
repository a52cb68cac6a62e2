"""Checks on the real pulled pair (pulls it if absent: ~1.6 GB download, several minutes).

The folder and tokenizer checks run in CI; the two that generate with transformers (bf16, both
models, about half a minute on an AVX2-only CPU) are marked `real` (`make test-real`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_ssd.models import DRAFT_MODEL, MODELS, TARGET_MODEL, model_path
from sglang_ssd.models.convert import check_converted, tokenizer_fingerprint

pytestmark = pytest.mark.integration

PROMPT = "def fibonacci(n):"
NEW_TOKENS = 24
MIN_AGREEMENT = 0.6  # measured ≈ 0.87 over prompts; one short prompt varies more


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    return {name: model_path(name) for name in (TARGET_MODEL, DRAFT_MODEL)}


@pytest.fixture(scope="module")
def greedy(folders: dict[str, Path]) -> dict[str, list[int]]:
    """Per model: its greedy continuation of PROMPT (token ids, transformers, bf16), and under
    "agreement" the draft's argmax at each position of the target's continuation (teacher forced,
    as speculative verification sees it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders[TARGET_MODEL])
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    out: dict[str, list[int]] = {}
    for name in (TARGET_MODEL, DRAFT_MODEL):
        model = AutoModelForCausalLM.from_pretrained(folders[name], dtype=torch.bfloat16)
        with torch.inference_mode():
            tokens = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            out[name] = tokens[0, ids.shape[1] :].tolist()
            if name == DRAFT_MODEL:
                forced = torch.tensor([ids[0].tolist() + out[TARGET_MODEL]])
                logits = model(forced).logits[0, ids.shape[1] - 1 : -1]
                out["agreement"] = logits.argmax(-1).tolist()
        del model
    return out


def test_folders_pass_their_checks(folders: dict[str, Path]) -> None:
    for name, folder in folders.items():
        check_converted(folder, MODELS[name])
        assert not list(folder.glob("*.gguf"))


def test_target_and_draft_share_the_tokenizer(folders: dict[str, Path]) -> None:
    assert tokenizer_fingerprint(folders[TARGET_MODEL]) == tokenizer_fingerprint(
        folders[DRAFT_MODEL]
    )


@pytest.mark.real
def test_greedy_output_is_code(folders: dict[str, Path], greedy: dict[str, list[int]]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders[TARGET_MODEL])
    for name in (TARGET_MODEL, DRAFT_MODEL):
        text = tokenizer.decode(greedy[name])
        assert "return" in text or "if n" in text, f"{name} wrote {text!r}"


@pytest.mark.real
def test_draft_mostly_agrees_with_target(greedy: dict[str, list[int]]) -> None:
    target, draft = greedy[TARGET_MODEL], greedy["agreement"]
    agreement = sum(t == d for t, d in zip(target, draft, strict=True)) / len(target)
    assert agreement >= MIN_AGREEMENT

"""The speculator engine with an EAGLE-3 head as its draft, against the tiny target offline.

A transformers target plays the SSD target: each round it verifies the engine's draft greedily,
and the outcome (k, t*) goes back with the target's features of the k + 1 committed positions,
as the target sends them over the link; the prompt's features come with the first outcome.
Serving, pre-speculation (fork, tree decode, cache) and the refresh of verified rows run
unchanged with the head in place of a draft LM.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang_ssd.build.target_pass import target_pass
from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine
from sglang_ssd.speculator.head_model import HeadDraftModel
from sglang_ssd.testing.corpus import tiny_corpus
from sglang_ssd.testing.tiny_models import tokenize

GAMMA, ROUNDS = 4, 16


def _prompts() -> list[list[int]]:
    text = tiny_corpus(num_chars=3000, seed=901)  # the head trained on seeds 100..111
    return [tokenize(text[i : i + 160]) for i in (0, 700, 1400)]


@torch.no_grad()
def _run(engine: SpeculatorEngine, target, aux: tuple[int, ...], prompt: list[int]) -> list:
    """ROUNDS verified rounds of one greedy request; returns (accept length, source) each."""
    engine.open("r", prompt, temperature=0.0, top_k=1, top_p=1.0, prefill=False)
    feats, logits = target_pass(target, torch.tensor([prompt]), aux)
    committed = list(prompt)
    outcome, start, n = OutcomeIn("r", 0, int(logits[0, -1].argmax())), 0, len(prompt)
    out = []
    for _ in range(ROUNDS):
        engine.apply_outcomes([outcome])
        committed += engine.requests["r"].committed[len(committed) :]
        assert engine.add_features("r", start, feats[0, start : start + n])
        engine.refresh_features()
        (draft,) = engine.serve(["r"], backup="jit", depth=GAMMA)
        engine.build(["r"])
        root = len(committed) - 1
        feats, logits = target_pass(target, torch.tensor([committed + draft.tokens]), aux)
        greedy = logits[0, root:].argmax(-1).tolist()
        k = next((j for j, t in enumerate(draft.tokens) if t != greedy[j]), len(draft.tokens))
        out.append((k + 1, draft.source))
        outcome, start, n = OutcomeIn("r", k, greedy[k]), root, k + 1
    engine.close("r")
    return out


@pytest.fixture(scope="module")
def target(tiny_target: Path):
    return AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()


def test_a_trained_head_speculates_through_the_engine(tiny_eagle3_head, tiny_target, target):
    """Accept length > 1.2, cache hits among the
    drafts, and the KV pool empty after each request."""
    folder, _ = tiny_eagle3_head
    model = HeadDraftModel.load(folder, tiny_target, dtype=torch.float32, num_slots=8192)
    engine = SpeculatorEngine(model, SSDConfig(lookahead=GAMMA, fanout_budget=8), seed=0)
    aux = model.config.aux_layer_ids
    rounds = []
    for prompt in _prompts():
        rounds += _run(engine, target, aux, prompt)
        assert engine.num_used_slots() == 0
    accept = sum(n for n, _ in rounds) / len(rounds)
    sources = [s for _, s in rounds]
    assert accept > 1.2, (accept, sources)
    assert "cache" in sources, sources
    assert model.forward_count > 0

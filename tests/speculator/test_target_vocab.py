"""A draft whose LM head is wider than the target's: the ids beyond the
target's vocabulary are cut before sampling (`draft_vocab.limit`), so no draft token, fork
candidate or random backup lands there and q is exactly zero there."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator import draft_vocab
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.draft_vocab import DraftVocab, limit
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.testing.tiny_models import TinySpec, make_tiny_model

PROMPT = [40, 71, 72, 73, 0, 5, 9, 71]
DRAFT_V, TARGET_V = 128, 100


def test_limit_cuts_only_ids_the_target_lacks() -> None:
    whole = limit(None, DRAFT_V, TARGET_V)
    assert whole is not None and whole.vocab_size == DRAFT_V
    assert torch.equal(whole.ids, torch.arange(TARGET_V))
    reduced = DraftVocab(torch.tensor([3, 50, 99, 100, 120]), DRAFT_V, "test")
    cut = limit(reduced, DRAFT_V, TARGET_V)
    assert cut is not None and cut.ids.tolist() == [3, 50, 99] and "cut" in cut.source
    assert limit(reduced, DRAFT_V, DRAFT_V) is reduced  # as wide: nothing to cut
    assert limit(None, DRAFT_V, 152_064) is None  # narrower draft: the target pads q instead
    with pytest.raises(ValueError, match="no draft id"):
        limit(DraftVocab(torch.tensor([110]), DRAFT_V), DRAFT_V, TARGET_V)
    with pytest.raises(ValueError, match=">= 1"):
        limit(None, DRAFT_V, 0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> SpeculatorEngine:
    path = make_tiny_model(tmp_path_factory.mktemp("wide"), TinySpec(num_layers=1, seed=3))
    model = DraftModel.load(path, dtype=torch.float32, num_slots=4096)
    assert model.vocab_size == DRAFT_V
    draft_vocab.limit_to_target(model, TARGET_V)
    return SpeculatorEngine(model, SSDConfig(lookahead=4, fanout_budget=6), seed=0)


def test_a_wider_draft_never_drafts_beyond_the_target(engine: SpeculatorEngine) -> None:
    # Random weights spread the draft's mass over all 128 ids: uncut, 28 of them lie beyond.
    engine.open("t", PROMPT, temperature=1.5, top_k=-1, top_p=1.0, seed=1)
    engine.open("g", PROMPT[:5], temperature=0.0, top_k=1, top_p=1.0)
    sampled, greedy = engine.serve(["t", "g"], backup="jit", depth=4)
    assert sampled.q is not None and sampled.q.shape == (4, DRAFT_V)
    assert bool((sampled.q[:, TARGET_V:] == 0).all())
    assert torch.allclose(sampled.q[:, :TARGET_V].sum(-1), torch.ones(4))
    for draft in (sampled, greedy):
        assert max(draft.tokens) < TARGET_V
        assert int(draft.candidates.max()) < TARGET_V
    assert engine.token_limit == TARGET_V
    assert int(engine.random.propose(None, 256).max()) < TARGET_V

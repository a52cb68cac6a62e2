"""Many speculator rounds in a row: every greedy draft equals a fresh drafter's for its prefix.

A greedy draft is a deterministic function of the committed tokens. A hit hands the branch's KV
slots to the committed path, so a wrong branch's KV, a slot freed too early or a shifted RoPE
position does not show in the hit itself (its tokens were drafted at build time) but in every
draft built on top of it. This test walks several rounds through hits at varied accept lengths
and misses, and plain rounds (tokens the target committed without a draft, which make the
cached next draft stale), and compares each round's draft with a fresh engine's just-in-time
draft.
"""

from __future__ import annotations

import random

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine
from sglang_ssd.testing.tiny_models import tokenize

PROMPT = tokenize("def merge_node(left, right):~    if left > 3:~")
ROUNDS = 12


def _engine(path) -> SpeculatorEngine:
    model = DraftModel.load(path, dtype=torch.float32, num_slots=8192)
    return SpeculatorEngine(model, SSDConfig(lookahead=4, fanout_budget=8), seed=0)


def _fresh_draft(path, committed: list[int]) -> list[int]:
    fresh = _engine(path)
    fresh.open("r", committed[:-1], temperature=0.0, top_k=1, top_p=1.0)
    fresh.apply_outcomes([OutcomeIn("r", 0, committed[-1])])
    (draft,) = fresh.serve(["r"], backup="jit", depth=4)
    return draft.tokens


def _next_outcome(engine: SpeculatorEngine, rng: random.Random, round_no: int) -> OutcomeIn:
    """A cached outcome (a hit next round) on most rounds; an uncached one (a miss) every 4th;
    a cached one followed by 1-3 tokens of plain rounds every 6th (from the 2nd)."""
    branches = engine.requests["r"].branches
    assert branches is not None
    if round_no % 4 == 3:
        cached = set(zip(branches.ks, branches.bonus, strict=True))
        bonus = next(t for t in range(engine.vocab_size) if (0, t) not in cached)
        return OutcomeIn("r", 0, bonus)
    row = rng.randrange(len(branches.ks))
    extra = [rng.randrange(3, engine.vocab_size) for _ in range(rng.randint(1, 3))]
    return OutcomeIn("r", branches.ks[row], branches.bonus[row], extra if round_no % 6 == 1 else ())


def test_every_round_drafts_what_a_fresh_drafter_would(tiny_draft) -> None:
    engine = _engine(tiny_draft)
    rng = random.Random(0)
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    sources = []
    committed_before = PROMPT
    for round_no in range(ROUNDS):
        (draft,) = engine.serve(["r"], backup="jit", depth=4)
        committed = engine.requests["r"].committed
        assert committed[: len(committed_before)] == committed_before
        committed_before = committed
        sources.append(draft.source)
        assert draft.tokens == _fresh_draft(tiny_draft, committed), (
            f"round {round_no} ({draft.source}): draft differs from a fresh drafter's"
        )
        engine.build(["r"])
        outcome = _next_outcome(engine, rng, round_no)
        assert engine.apply_outcomes([outcome]) == []
        state = engine.requests["r"]
        assert state.committed[len(state.committed) - len(outcome.extra) :] == list(outcome.extra)
        assert state.num_fed <= len(state.sequence)
    assert sources.count("cache") >= ROUNDS // 2 and "jit" in sources, sources
    used = engine.num_used_slots()
    engine.close("r")
    assert engine.num_used_slots() == 0 < used

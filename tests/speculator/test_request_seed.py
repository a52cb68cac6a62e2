"""Draft RNG seeds of seeded requests (`engine.request_seed`): SGLang's `n > 1` copies share one
`sampling_seed` and differ in rid, and must draw independent drafts, as SGLang samples the
copies independently."""

from __future__ import annotations

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import SpeculatorEngine, request_seed

PROMPT = [40, 71, 72, 73, 0, 5, 9]
COPIES = 64  # 32 disjoint pairs
TEMPERATURE = 2.0  # a flat q: two independent draws rarely agree


def test_the_seed_is_mixed_with_the_rid() -> None:
    assert request_seed(7, "a-0") == request_seed(7, "a-0")
    assert len({request_seed(7, f"a-{i}") for i in range(100)}) == 100
    assert request_seed(7, "a-0") != request_seed(8, "a-0")
    assert all(0 <= request_seed(s, "r") < 2**62 for s in (0, 2**63 - 1, -5))


def test_copies_with_one_seed_draw_independent_drafts(tiny_draft) -> None:
    """Pooled over 32 disjoint pairs of copies (same prompt, same seed, T = 2): the pairs whose
    first draft tokens agree. Independent draws agree with probability s = Σ q(t)² per pair; one
    shared stream agrees in every pair. The test fails only if all 32 pairs agree: a false alarm
    has probability s^32 (s is measured below, < 0.35 here: < 1e-14), and a shared stream is
    caught with probability 1."""
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=4096)
    engine = SpeculatorEngine(model, SSDConfig(lookahead=4, fanout_budget=4), seed=0)
    rids = [f"copy-{i}" for i in range(COPIES)]
    for rid in rids:
        engine.open(rid, PROMPT, temperature=TEMPERATURE, top_k=-1, top_p=1.0, seed=1234)
    drafts = engine.serve(rids, backup="jit", depth=1)
    q = drafts[0].q[0]
    assert all(torch.equal(d.q[0], q) for d in drafts)  # one law for every copy
    s = float((q * q).sum())
    assert s < 0.35, s
    first = [d.tokens[0] for d in drafts]
    agree = sum(first[i] == first[i + 1] for i in range(0, COPIES, 2))
    assert agree < COPIES // 2, (agree, s)

"""The speculator's round on a tiny random model: JIT drafts, glue/fork/tree decode, cache hits.

For greedy requests the draft is a deterministic function of the committed tokens, so a cache hit
must hand out exactly the draft a fresh just-in-time drafter would produce for the same prefix —
that checks the branch KV, the tree mask, the RoPE positions and the slot bookkeeping at once.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine

PROMPT = [40, 71, 72, 73, 0, 5, 9, 71, 72, 33, 34]


def _engine(path, **config) -> SpeculatorEngine:
    """An engine with one static fan-out per round (geometric) unless `config` says otherwise:
    these tests count branches per request, which the predicted fan-out moves between them."""
    model = DraftModel.load(path, dtype=torch.float32, num_slots=4096)
    cfg = SSDConfig(lookahead=4, fanout_budget=6, **{"fanout": "geometric", **config})
    return SpeculatorEngine(model, cfg, seed=0)


def _hf_greedy(path, tokens: list[int], n: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([tokens])
    # An explicit all-ones mask: with pad_token_id=0 and no mask, HF masks every id-0 token.
    mask = torch.ones_like(ids)
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0
    )
    return out[0, len(tokens) :].tolist()


def test_jit_greedy_draft_is_the_draft_models_greedy_continuation(tiny_draft):
    engine = _engine(tiny_draft)
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    (draft,) = engine.serve(["r"], backup="jit", depth=4)
    assert draft.source == "jit" and draft.q is None
    assert draft.tokens == _hf_greedy(tiny_draft, PROMPT, 4)


def test_build_runs_one_forward_for_glue_and_one_per_tree_depth(tiny_draft):
    engine = _engine(tiny_draft, tree_depth=3)
    engine.open("a", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    engine.open("b", PROMPT[:7], temperature=0.7, top_k=-1, top_p=1.0)
    engine.serve(["a", "b"], backup="jit", depth=4)
    before = engine.model.forward_count
    engine.build(["a", "b"])
    assert engine.model.forward_count - before == 1 + 3
    for rid in ("a", "b"):
        branches = engine.requests[rid].branches
        assert branches is not None and len(branches.ks) == 6
        assert branches.slots.shape == (6, 3)


@pytest.mark.parametrize("use_k", [0, 2, 4])
def test_cache_hit_equals_fresh_jit_draft_for_greedy(tiny_draft, use_k):
    engine = _engine(tiny_draft, fanout="uniform")
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    (draft,) = engine.serve(["r"], backup="jit", depth=4)
    engine.build(["r"])
    state = engine.requests["r"]
    rows = [i for i, k in enumerate(state.branches.ks) if k == use_k]
    assert rows, f"uniform fan-out must fork at k={use_k}"
    bonus = state.branches.bonus[rows[0]]
    committed = PROMPT + draft.tokens[:use_k] + [bonus]

    engine.apply_outcomes([OutcomeIn("r", use_k, bonus)])
    hit = engine.requests["r"].draft
    assert hit is not None and hit.source == "cache"

    fresh = _engine(tiny_draft)
    fresh.open("r", committed[:-1], temperature=0.0, top_k=1, top_p=1.0)
    fresh.apply_outcomes([OutcomeIn("r", 0, committed[-1])])
    (expected,) = fresh.serve(["r"], backup="jit", depth=4)
    assert hit.tokens == expected.tokens
    assert engine.requests["r"].committed == committed


def test_miss_frees_branches_and_falls_back(tiny_draft):
    engine = _engine(tiny_draft)
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    engine.serve(["r"], backup="jit", depth=4)
    engine.build(["r"])
    used_with_branches = engine.num_used_slots()
    state = engine.requests["r"]
    unseen = next(
        t
        for t in range(90)
        if (4, t) not in zip(state.branches.ks, state.branches.bonus, strict=False)
    )
    engine.apply_outcomes([OutcomeIn("r", 4, unseen)])
    assert engine.requests["r"].draft is None
    assert engine.num_used_slots() < used_with_branches
    (draft,) = engine.serve(["r"], backup="ngram", depth=4)
    assert draft.source == "ngram" and len(draft.tokens) == 4
    engine.build(["r"])  # glue over a point-mass draft fills every fork point
    assert engine.requests["r"].branches is not None


def test_sampled_drafts_carry_exact_q_and_close_frees_everything(tiny_draft):
    engine = _engine(tiny_draft, beta=0.5)
    engine.open("s", PROMPT, temperature=0.8, top_k=-1, top_p=0.95)
    (draft,) = engine.serve(["s"], backup="jit", depth=4)
    assert draft.q is not None and draft.q.shape == (4, engine.vocab_size)
    assert torch.allclose(draft.q.sum(-1), torch.ones(4), atol=1e-5)
    assert all(float(draft.q[j, t]) > 0 for j, t in enumerate(draft.tokens))
    engine.build(["s"])
    engine.apply_outcomes([OutcomeIn("s", 1, engine.requests["s"].branches.bonus[0])])
    engine.close("s")
    assert engine.num_used_slots() == 0
    assert len(engine.cache) == 0


def test_bad_outcome_is_reported_not_raised(tiny_draft):
    engine = _engine(tiny_draft)
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    engine.serve(["r"], backup="jit", depth=4)
    assert engine.apply_outcomes([OutcomeIn("r", 9, 3), OutcomeIn("zz", 0, 1)]) == ["r", "zz"]
    assert "r" not in engine.requests
    assert engine.num_used_slots() == 0


def test_first_round_prespeculated_at_prefill_hits_for_greedy(tiny_draft):
    engine = _engine(tiny_draft)
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    engine.prespeculate_first_round("r")
    branches = engine.requests["r"].branches
    assert branches is not None and set(branches.ks) == {0}
    first = branches.bonus[1]  # not the draft's favourite: the target may disagree
    engine.apply_outcomes([OutcomeIn("r", 0, first)])
    hit = engine.requests["r"].draft
    assert hit is not None and hit.source == "cache"

    fresh = _engine(tiny_draft)
    fresh.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    fresh.apply_outcomes([OutcomeIn("r", 0, first)])
    (expected,) = fresh.serve(["r"], backup="jit", depth=4)
    assert hit.tokens == expected.tokens


def test_unverified_first_round_speculation_is_dropped_by_serve(tiny_draft):
    engine = _engine(tiny_draft)
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    engine.prespeculate_first_round("r")
    (draft,) = engine.serve(["r"], backup="ngram", depth=4)
    assert draft.source == "ngram" and len(draft.tokens) == 4
    engine.close("r")
    assert engine.num_used_slots() == 0


def test_unverified_first_round_speculation_then_jit_drafts_from_the_root(tiny_draft):
    engine = _engine(tiny_draft)
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    engine.prespeculate_first_round("r")
    (draft,) = engine.serve(["r"], backup="jit", depth=4)
    assert draft.source == "jit"
    assert draft.tokens == _hf_greedy(tiny_draft, PROMPT, 4)


def test_one_fanout_plan_per_round_and_outcomes_feed_the_hit_model(tiny_draft, monkeypatch):
    engine = _engine(tiny_draft)
    plans = []
    make_plan = engine.live.plan
    monkeypatch.setattr(engine.live, "plan", lambda *a: plans.append(make_plan(*a)) or plans[-1])
    for rid, prompt in (("a", PROMPT), ("b", PROMPT[:6]), ("c", PROMPT[2:])):
        engine.open(rid, prompt, temperature=0.0, top_k=1, top_p=1.0)
    engine.serve(["a", "b", "c"], backup="jit", depth=4)
    assert len(plans) == 1
    engine.build(["a", "b", "c"])
    assert len(plans) == 2
    state = engine.requests["a"]
    k, bonus = state.branches.ks[0], state.branches.bonus[0]
    fanouts = (state.branches.ks.count(k), engine.requests["b"].branches.ks.count(4))
    engine.apply_outcomes([OutcomeIn("a", k, bonus), OutcomeIn("b", 4, 95)])
    assert engine.live.num_hit_observations == 2
    stats = engine.stats()
    assert stats.hit_exponent == engine.hit_exponent == engine.live.hit_exponent
    # Cumulative counters for the speedup model: outcomes and hits by F, builds by depth.
    hits = [engine.requests[r].draft is not None and engine.requests[r].draft.source == "cache"
            for r in ("a", "b")]  # fmt: skip
    assert hits[0]
    assert stats.fanout_outcomes == {f: fanouts.count(f) for f in fanouts}
    assert sum(stats.fanout_hits.values()) == sum(hits)
    assert stats.builds_at_depth == {engine.last_build_depth: 1}


def test_applied_outcomes_feed_the_fanout_alpha_at_the_drafts_depth(tiny_draft):
    """k of a d-token draft accepted tried k + 1 tokens (k < d): the counts behind the fan-out's
    α move by exactly that, decayed from the prior; a failed outcome feeds nothing."""
    engine = _engine(tiny_draft)
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    (draft,) = engine.serve(["r"], backup="jit", depth=4)
    counts = engine.live.acceptance
    before = (counts.accepted, counts.tried)
    engine.apply_outcomes(
        [OutcomeIn("r", 1, (draft.tokens[1] + 1) % 90), OutcomeIn("nobody", 0, 3)]
    )
    keep = 1.0 - counts.decay
    assert counts.accepted == pytest.approx(keep * before[0] + 1)
    assert counts.tried == pytest.approx(keep * before[1] + 2)

"""The speculator under a KV pool too small for its requests, and with long prompts.

A full pool must never raise: the requests that do not fit get n-gram drafts (or skip their
pre-speculation) and are counted in `kv_exhausted`, while the others draft exactly as with a
large pool. Prefill is fed in chunks: a Step right after a long Open is answered without any of
its prefill (a Step feeds only short backlogs), the long request drafting by n-gram until its
prefill is done between rounds, and then exactly as if it had been prefilled at once.
"""

from __future__ import annotations

import os

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine
from sglang_ssd.speculator.server import SpeculatorServer
from sglang_ssd.transport import Open, SamplingSpec, Step
from tests.speculator.queued_link import QueuedLink

PROMPT = [40, 71, 72, 73, 0, 5, 9, 71, 72, 33, 34]  # 11 tokens: 10 prefilled, then the root
LONG = [(7 * i + 3) % 90 for i in range(300)]
GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0}


def _engine(path, slots: int = 4096, **config) -> SpeculatorEngine:
    model = DraftModel.load(path, dtype=torch.float32, num_slots=slots)
    return SpeculatorEngine(model, SSDConfig(lookahead=4, fanout_budget=6, **config), seed=0)


def _jit_greedy(path, tokens: list[int]) -> list[int]:
    """The jit draft of a request prefilled at once in a large pool."""
    engine = _engine(path)
    engine.open("r", tokens, **GREEDY)
    (draft,) = engine.serve(["r"], backup="jit", depth=4)
    return draft.tokens


def test_requests_the_pool_cannot_hold_get_ngram_drafts_and_the_others_jit(tiny_draft):
    small = _engine(tiny_draft, slots=40)
    prompts = {"a": PROMPT, "b": PROMPT[::-1], "c": PROMPT[2:] + PROMPT[:2]}
    for rid, prompt in prompts.items():
        small.open(rid, prompt, **GREEDY)  # 10 slots each: 30 of 40 used
    a, b, c = small.serve(list(prompts), backup="jit", depth=4)  # jit: 4 slots per request
    b_first, c_first = b.tokens[0], c.tokens[0]
    assert (a.source, b.source, c.source) == ("jit", "jit", "ngram")
    assert a.tokens == _jit_greedy(tiny_draft, prompts["a"])
    assert b.tokens == _jit_greedy(tiny_draft, prompts["b"])
    assert c.tokens == small.ngram.propose(prompts["c"], 4).tolist()
    assert small.stats().kv_exhausted_drafts == 1
    small.build(list(prompts))  # 5 glue + 6 × 4 branch slots each: none fits in the 2 left
    assert small.stats().kv_exhausted == 1 + 3
    assert all(s.branches is None for s in small.requests.values())
    small.apply_outcomes([OutcomeIn(r, 1, 5) for r in prompts])
    small.close("a")  # frees its slots: b and c draft by jit again
    b, c = small.serve(["b", "c"], backup="jit", depth=4)
    assert (b.source, c.source) == ("jit", "jit")
    assert b.tokens == _jit_greedy(tiny_draft, prompts["b"] + [b_first, 5])
    assert c.tokens == _jit_greedy(tiny_draft, prompts["c"] + [c_first, 5])
    assert small.stats().kv_exhausted_drafts == 1


def test_a_prompt_larger_than_the_free_pool_is_prefilled_as_slots_free_up(tiny_draft):
    small = _engine(tiny_draft, slots=24)
    small.open("a", PROMPT, **GREEDY)
    small.open("long", LONG[:40], **GREEDY)  # 14 of its 39 prefill tokens fit
    assert small.requests["long"].backlog == 39 - 14 and small.num_used_slots() == 24
    (draft,) = small.serve(["long"], backup="jit", depth=4)
    assert draft.source == "ngram" and small.stats().kv_exhausted_drafts == 1
    assert not small.prefill_pending()  # nothing to do until slots free up: no busy loop
    small.close("a")
    small.close("long")
    small.open("long", LONG[:20], **GREEDY)
    (draft,) = small.serve(["long"], backup="jit", depth=4)
    assert draft.source == "jit" and draft.tokens == _jit_greedy(tiny_draft, LONG[:20])


def test_a_step_after_a_long_open_does_not_wait_for_its_prefill(tiny_draft):
    engine = _engine(tiny_draft)
    engine.prefill_chunk_tokens = 16
    engine.open("long", LONG, **GREEDY, prefill=False)
    engine.open("short", PROMPT, **GREEDY, prefill=False)
    before = engine.model.forward_count
    long, short = engine.serve(["long", "short"], backup="jit", depth=4)
    assert engine.model.forward_count - before == 1 + 4  # the short backlog, four jit steps
    assert short.source == "jit"  # 10 unfed tokens: within `serve_prefill_tokens`, fed now
    assert long.source == "ngram" and engine.requests["long"].num_fed == 0
    assert engine.stats().prefill_backup_drafts == 1
    assert engine.stats().prefilling_requests == 1
    engine.apply_outcomes([OutcomeIn("long", 0, 9), OutcomeIn("short", 0, 9)])
    while engine.prefill_pending():
        engine.advance_prefill()
    at_once = _engine(tiny_draft)
    at_once.open("long", [*LONG, 9], **GREEDY)
    assert torch.allclose(_kv(engine, "long"), _kv(at_once, "long"), atol=1e-5)
    long, short = engine.serve(["long", "short"], backup="jit", depth=4)
    assert long.source == short.source == "jit"
    assert long.tokens == _jit_greedy(tiny_draft, [*LONG, 9])  # chunked KV = KV fed at once
    assert short.tokens == _jit_greedy(tiny_draft, [*PROMPT, 9])


def _kv(engine: SpeculatorEngine, rid: str) -> torch.Tensor:
    """[layers, 2, num_fed, Hkv, d]: the K and V the pool holds for a request's fed prefix."""
    pool, slots = engine.model.kv_pool, engine.requests[rid].slots
    return torch.stack(
        [torch.stack([k[slots], v[slots]]) for k, v in zip(pool.k, pool.v, strict=True)]
    )


def test_the_server_answers_a_step_before_a_long_prefill_then_prefills_between_rounds(
    tiny_draft,
):
    engine = _engine(tiny_draft)
    engine.prefill_chunk_tokens = 32
    greedy = SamplingSpec(temperature=0.0, top_k=1, top_p=1.0)
    link = QueuedLink(
        engine,
        [
            Open(rid="long", token_ids=LONG, sampling=greedy, prespeculate=True),
            Open(rid="short", token_ids=PROMPT, sampling=greedy, prespeculate=True),
            Open(rid="later", token_ids=LONG[:50], sampling=greedy, prespeculate=True),
            Step(step_id=1, outcomes=[], requests=["short", "long"], backup="jit"),
        ],
    )
    SpeculatorServer(link, engine, parent_pid=os.getppid()).run()
    assert not link.sent, link.sent  # no Error
    ((reply, fed),) = link.replies
    sources = {e.rid: e.source for e in reply.entries}
    assert sources == {"short": "jit", "long": "ngram"}
    assert fed["long"] <= 32 < len(LONG) - 1
    state = engine.requests["long"]
    assert state.backlog == 0 and state.draft is not None  # prefilled after the reply
    assert state.branches is None  # an outcome is due: no first-round speculation now
    later = engine.requests["later"]  # not in the Step: prefilled, then its first round built
    assert later.draft is not None and later.draft.source == "prefill"
    assert later.branches is not None and set(later.branches.ks) == {0}


def test_a_sync_step_feeds_a_long_prompt_at_once(tiny_draft):
    """A sync round's Step (`feed_all`): the target waits for this draft on every core, so the
    whole backlog is fed now and the draft is just in time, never an n-gram stand-in."""
    engine = _engine(tiny_draft)
    engine.prefill_chunk_tokens = 16
    engine.open("long", LONG, **GREEDY, prefill=False)
    (long,) = engine.serve(["long"], backup="jit", depth=4, feed_all=True)
    assert long.source == "jit" and long.tokens == _jit_greedy(tiny_draft, LONG)
    assert engine.stats().prefill_backup_drafts == 0

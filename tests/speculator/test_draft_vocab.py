"""A reduced draft vocabulary (`--ssd-draft-vocab`): the draft's LM head covers only
the kept ids, every draft token, fork candidate and cached branch stays among them, q is zero
outside them and sums to one on them, and the logits on kept ids are the full head's."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
from transformers import AutoTokenizer

from sglang_ssd.build.vocab import count_ids, top_ids
from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator import draft_vocab
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.draft_vocab import DraftVocab
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine
from sglang_ssd.speculator.packing import causal_segment, pack
from sglang_ssd.speculator.server import SpeculatorServer
from sglang_ssd.testing.corpus import tiny_corpus
from sglang_ssd.transport import Open, Outcome, SamplingSpec, Step
from sglang_ssd.worker.draft_batch import dense_q
from tests.speculator.queued_link import QueuedLink

PROMPT = [40, 71, 72, 73, 0, 5, 9, 71, 72, 33, 34]
KEPT = 40  # of the tiny tokenizer's 96 tokens: the target often wants one the draft lacks


def _vocab(path) -> DraftVocab:
    """The tiny draft's KEPT most frequent ids on its own training corpus, plus its EOS."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = DraftModel.load(path, dtype=torch.float32, num_slots=16)
    counts = count_ids(tokenizer, [tiny_corpus()], model.vocab_size)
    return DraftVocab(top_ids(counts, KEPT, model.eos_token_ids), model.vocab_size, "test")


def _engine(path, vocab: DraftVocab | None, **config) -> SpeculatorEngine:
    model = DraftModel.load(path, dtype=torch.float32, num_slots=4096)
    model.use_vocab(vocab)
    return SpeculatorEngine(model, SSDConfig(lookahead=4, fanout_budget=6, **config), seed=0)


def test_vocabulary_ids_must_be_sorted_distinct_and_in_range() -> None:
    with pytest.raises(ValueError, match="sorted and distinct"):
        DraftVocab(torch.tensor([3, 1]), 6)
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        DraftVocab(torch.tensor([1, 6]), 6)


def test_cached_vocabulary_round_trips(tiny_draft, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_SSD_CACHE", str(tmp_path))
    vocab = _vocab(tiny_draft)
    path = draft_vocab.save(vocab, tiny_draft, KEPT)
    assert path.parent == tmp_path / "draft_vocab"
    again = draft_vocab.load_or_build(tiny_draft, KEPT, vocab.vocab_size, eos_ids=[])
    assert torch.equal(again.ids, vocab.ids) and str(path) in again.source
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=16)
    assert (
        draft_vocab.install(model, tiny_draft, KEPT).size == vocab.size
    )  # what the speculator runs
    assert model.vocab is not None and torch.equal(model.vocab.ids, vocab.ids)
    whole = draft_vocab.install(model, tiny_draft, 10**6)
    assert whole.size == vocab.vocab_size  # N >= V: every id, nothing counted
    assert model.vocab is None  # the full head, no copy
    with pytest.raises(ValueError, match=">= 1"):
        draft_vocab.load_or_build(tiny_draft, 0, vocab.vocab_size, eos_ids=[])


def test_a_cache_miss_runs_the_build_tool(tiny_draft, tmp_path, monkeypatch) -> None:
    """The loader counts nothing itself: on a miss it runs `python -m sglang_ssd.build.vocab`
    (here in this process, on a tiny corpus) and reads what it cached."""
    from sglang_ssd.build import corpus, vocab

    monkeypatch.setenv("SGLANG_SSD_CACHE", str(tmp_path))
    text = tmp_path / "tiny.py"
    text.write_text(tiny_corpus())
    monkeypatch.setattr(corpus, "vocab_files", lambda: [text])
    commands = []

    def run(command, check):
        assert command[1:3] == ["-m", "sglang_ssd.build.vocab"]
        commands.append(command)
        vocab.main(command[3:])
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(draft_vocab.subprocess, "run", run)
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=16)
    got = draft_vocab.install(model, tiny_draft, KEPT)
    assert len(commands) == 1 and "read from" in got.source
    assert torch.equal(got.ids, _vocab(tiny_draft).ids)  # the same counts as in this process
    draft_vocab.install(model, tiny_draft, KEPT)
    assert len(commands) == 1  # cached: nothing run again


def test_reduced_head_gives_the_full_heads_logits_on_kept_ids(tiny_draft) -> None:
    vocab = _vocab(tiny_draft)
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=64)
    slots = model.kv_pool.alloc(len(PROMPT))
    packed = pack(
        [causal_segment(torch.empty(0, dtype=torch.int64), torch.tensor(PROMPT), 0, slots)],
        model.device,
    )
    args = (packed.input_ids, packed.positions, packed.out_slots, packed.layout)
    full = model.forward(*args)
    model.use_vocab(vocab)
    reduced = model.forward(*args)
    kept = torch.zeros(model.vocab_size, dtype=torch.bool)
    kept[vocab.ids] = True
    assert torch.allclose(reduced[:, kept], full[:, kept], atol=1e-5)
    assert bool(torch.isneginf(reduced[:, ~kept]).all())
    # The full head's argmax is often outside the kept ids: the reduced vocabulary bites.
    assert bool((~kept[full.argmax(-1)]).any())


def test_drafts_candidates_and_cached_branches_stay_in_the_vocabulary(tiny_draft) -> None:
    vocab = _vocab(tiny_draft)
    kept = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    kept[vocab.ids] = True
    engine = _engine(tiny_draft, vocab, beta=0.5)
    engine.open("g", PROMPT, temperature=0.0, top_k=1, top_p=1.0)
    engine.open("s", PROMPT[:8], temperature=1.0, top_k=-1, top_p=1.0)
    greedy, sampled = engine.serve(["g", "s"], backup="jit", depth=4)
    for draft in (greedy, sampled):
        assert bool(kept[torch.tensor(draft.tokens)].all())
        candidates = draft.candidates[draft.candidates >= 0]
        assert bool(kept[candidates].all())
    q = sampled.q
    assert q is not None and torch.allclose(q.sum(-1), torch.ones(4), atol=1e-5)
    assert float(q[:, ~kept].abs().max()) == 0.0  # q is zero outside: what verify is told
    engine.build(["g", "s"])
    for rid in ("g", "s"):
        branches = engine.requests[rid].branches
        assert branches is not None
        row = 0
        found = engine.cache.lookup([rid], [branches.ks[row]], [branches.bonus[row]])
        tokens = found.draft_tokens[0]
        assert bool(kept[tokens[tokens >= 0]].all())
        if rid == "s":
            probs = found.dense_probs()[0]
            assert float(probs[:, ~kept].abs().max()) == 0.0
            assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[0]), atol=1e-5)
    engine.apply_outcomes([OutcomeIn("g", 0, int(vocab.ids[0])), OutcomeIn("s", 0, 5)])
    assert engine.stats().draft_vocab_size == vocab.size


def test_the_server_sends_q_at_the_vocabularys_columns(tiny_draft) -> None:
    """q leaves the speculator at the draft vocabulary's width (the ids its
    Hello announces), sums to one there, and the target's scatter gives back the draft's own
    q row over all V ids."""
    vocab = _vocab(tiny_draft)
    engine = _engine(tiny_draft, vocab, beta=0.5)
    assert torch.equal(engine.q_columns, vocab.ids)
    sampled = SamplingSpec(temperature=1.0, top_k=-1, top_p=1.0, seed=3)
    step = Step(
        step_id=1, outcomes=[Outcome(rid="s", accept_len=0, bonus=71)], requests=["s"], backup="jit"
    )
    link = QueuedLink(engine, [Open(rid="s", token_ids=PROMPT, sampling=sampled), step])
    SpeculatorServer(link, engine, parent_pid=os.getppid()).run()
    ((msg, _),) = link.replies
    ((_, q),) = link.tensors
    assert msg.entries[0].has_q and msg.q_columns == vocab.size
    assert q is not None and q.shape == (1, msg.max_depth, vocab.size)
    assert torch.allclose(q.sum(-1), torch.ones(1, msg.max_depth), atol=1e-5)
    full = dense_q(q, torch.tensor([True]), vocab.vocab_size, "cpu", engine.q_columns)
    draft = engine.requests["s"].draft
    assert draft is not None and draft.q is not None
    assert torch.equal(full[0, : draft.depth], draft.q)

"""eval.trace (record / replay) on tiny random models.

The invariants: a greedy recorded output is the target's own greedy continuation (SSD is
lossless); a replay forces the recorded output exactly and, with the recording's settings and
batch shape, reproduces every recorded round; hit rates lie in [0, 1].
"""

from __future__ import annotations

import itertools

import torch
from transformers import AutoModelForCausalLM

from eval.sampling import Sampling
from eval.trace.record import record
from eval.trace.replay import ReplayConfig, format_replay_table, replay, scripted_outcome
from eval.trace.target import HFTarget
from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import SpeculatorEngine

PROMPT = [40, 71, 72, 73, 0, 5, 9, 71, 72, 33, 34]
NEW_TOKENS = 12


def _record(tiny_target, tiny_draft, sampling: Sampling) -> tuple[dict, DraftModel]:
    target = HFTarget(tiny_target, dtype=torch.float32)
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=4096)
    engine = SpeculatorEngine(model, SSDConfig(lookahead=4, fanout_budget=8), seed=0)
    return record(target, engine, [PROMPT], sampling, NEW_TOKENS, seed=0), model


def test_scripted_outcome_forces_the_recorded_continuation():
    assert scripted_outcome([5, 6, 7], [5, 6, 9, 1]) == (2, 9)
    assert scripted_outcome([5, 6, 7], [5, 6, 7, 1]) == (3, 1)
    assert scripted_outcome([5, 6, 7], [5, 6]) == (1, 6)  # a bonus must remain
    assert scripted_outcome([], [3]) == (0, 3)


def test_record_and_replay_greedy(tiny_target, tiny_draft):
    trace, model = _record(tiny_target, tiny_draft, Sampling.of(0.0))
    (prompt,) = trace["prompts"]
    output, rounds = prompt["output_tokens"], trace["rounds"]
    assert NEW_TOKENS <= len(output) <= NEW_TOKENS + 4
    assert sum(r["accept_len"] + 1 for r in rounds) == len(output)
    assert [r["round"] for r in rounds] == list(range(len(rounds)))
    assert rounds[0]["source"] == "jit" and rounds[0]["committed_len"] == len(PROMPT)
    for prev, nxt in itertools.pairwise(rounds):
        assert nxt["committed_len"] == prev["committed_len"] + prev["accept_len"] + 1
        assert nxt["source"] == ("cache" if prev["hit"] else "jit")
    for r in rounds:
        assert 0 <= r["accept_len"] <= len(r["draft"]) <= 4
        assert min(r["build_s"], r["verify_s"], r["serve_s"]) >= 0
    assert 0.0 <= trace["summary"]["hit_rate"] <= 1.0

    hf = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32)
    ids = torch.tensor([PROMPT])
    # An explicit mask: PROMPT holds token 0, which generate() would otherwise take for padding
    # (pad_token_id=0) and mask out.
    ar = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=len(output),
        do_sample=False,
        pad_token_id=0,
    )
    assert output == ar[0, len(PROMPT) :].tolist(), "greedy SSD must equal the target's AR"

    configs = [
        ReplayConfig(shape, budget, depth)
        for shape in ("uniform", "geometric")
        for budget, depth in ((2, 4), (8, 4), (8, 2))
    ]
    results = replay(model, trace, configs, batch=1)
    assert len(results) == len(configs)
    for r in results:
        assert 0.0 <= r["hit_rate"] <= 1.0 and r["rounds"] > 0
        assert 1.0 <= r["mean_accept_length"] <= 4 + 1  # JIT drafts on misses have γ tokens
        assert r["outputs_reproduced"]
        assert sum(r["fanout_at_start"]) == r["budget"]
    as_recorded = next(
        r for r in results if (r["fanout"], r["budget"], r["depth"]) == ("geometric", 8, 4)
    )
    assert as_recorded["rounds_matching_record"] == 1.0
    assert as_recorded["hit_rate"] == trace["summary"]["hit_rate"]
    assert "hit uni" in format_replay_table(results)


def test_record_and_replay_sampled(tiny_target, tiny_draft):
    trace, model = _record(tiny_target, tiny_draft, Sampling.of(0.7))
    (prompt,) = trace["prompts"]
    assert sum(r["accept_len"] + 1 for r in trace["rounds"]) == len(prompt["output_tokens"])
    results = replay(model, trace, [ReplayConfig("uniform", 4, 4), ReplayConfig("geometric", 4, 4)])
    for r in results:
        assert 0.0 <= r["hit_rate"] <= 1.0
        assert r["outputs_reproduced"]

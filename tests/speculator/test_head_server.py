"""The speculator server hands a Step's target features to an EAGLE-3 head draft."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.speculator.head_model import HeadDraftModel
from sglang_ssd.speculator.kv_pool import KVPool
from sglang_ssd.speculator.server import SpeculatorServer
from sglang_ssd.testing.eagle3_heads import HIDDEN, VOCAB, head_config, random_head
from sglang_ssd.transport import FeatureSpan, Open, Outcome, SamplingSpec, Step
from tests.speculator.queued_link import QueuedLink

GREEDY = SamplingSpec(temperature=0.0, top_k=1, top_p=1.0)
PROMPT = list(range(10, 16))
F = 3 * HIDDEN


def _engine() -> SpeculatorEngine:
    head = random_head(head_config()).eval()
    head.attach_target(torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(2)))
    c = head.config
    pool = KVPool(1, 512, c.num_key_value_heads, c.head_dim, torch.float32)
    return SpeculatorEngine(HeadDraftModel(head, pool), SSDConfig(lookahead=3, fanout_budget=4))


def _step(step_id: int, k: int, bonus: int, spans: list[FeatureSpan]) -> Step:
    return Step(
        step_id=step_id,
        outcomes=[Outcome(rid="r", accept_len=k, bonus=bonus)],
        requests=["r"],
        backup="jit",
        features=spans,
        feature_size=F if spans else 0,
        feature_dtype="float32",
    )


def _serve(messages: list) -> QueuedLink:
    engine = _engine()
    opened = Open(rid="r", token_ids=PROMPT, sampling=GREEDY, prespeculate=False)
    link = QueuedLink(engine, [opened, *messages])
    SpeculatorServer(link, engine, parent_pid=os.getppid()).run()
    assert not link.sent, link.sent
    return link


def test_features_let_the_head_draft_and_refresh_verified_rows() -> None:
    """With the prompt's features the head drafts just in time; the next round's features
    (root + k accepted) refresh the rows fed before them. Without features the request can
    only get an n-gram draft."""
    g = torch.Generator().manual_seed(4)
    prompt_feats = torch.randn(len(PROMPT), F, generator=g)
    first = _serve([(_step(1, 0, 20, [FeatureSpan(rid="r", start=0, count=6)]), prompt_feats)])
    ((reply, _),) = first.replies
    assert reply.entries[0].source == "jit"
    root = len(PROMPT)  # the bonus 20 sits there; k = 2 accepted drafts follow it
    round_feats = torch.randn(3, F, generator=g)
    two = _serve(
        [
            (_step(1, 0, 20, [FeatureSpan(rid="r", start=0, count=6)]), prompt_feats),
            (_step(2, 2, 30, [FeatureSpan(rid="r", start=root, count=3)]), round_feats),
        ]
    )
    assert "refresh" in two.replies[1][0].timing.phases
    blind = _serve([_step(1, 0, 20, [])])
    assert blind.replies[0][0].entries[0].source == "ngram"


def test_the_speculator_loads_a_head_folder_as_a_head(tiny_eagle3_head, tiny_target) -> None:
    """`python -m sglang_ssd.speculator` picks the runtime by the folder: a head needs the
    target's folder (its embeddings), a draft LM does not."""
    from sglang_ssd.speculator.__main__ import load_draft
    from sglang_ssd.speculator.draft_model import DraftModel

    folder, _ = tiny_eagle3_head
    head = load_draft(str(folder), str(tiny_target), "cpu", torch.float32, 64)
    assert isinstance(head, HeadDraftModel) and head.kv_pool.num_slots <= 64
    with pytest.raises(ValueError, match="--target-model-path"):
        load_draft(str(folder), None, "cpu", torch.float32, 64)
    assert isinstance(load_draft(str(tiny_target), None, "cpu", torch.float32, 64), DraftModel)

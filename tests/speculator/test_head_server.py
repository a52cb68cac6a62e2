"""The speculator server hands a Step's target features to an EAGLE-3 head draft."""

from __future__ import annotations

import os
from pathlib import Path

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


def test_the_draft_runtime_follows_the_flag_and_the_folder(tiny_eagle3_head, tiny_target) -> None:
    """`--ssd-draft-runtime auto` (the default) picks the runtime by the folder: a head needs the
    target's folder (its embeddings), a draft LM does not; a named runtime that cannot load the
    folder, or an unknown name, is refused with the reason."""
    from sglang_ssd.speculator.draft_model import DraftModel
    from sglang_ssd.speculator.runtimes import LoadRequest, create_draft_runtime

    folder, _ = tiny_eagle3_head

    def request(path: Path, target: Path | None) -> LoadRequest:
        return LoadRequest(str(path), None if target is None else str(target), "cpu",
                           "float32", 64, 0.5)  # fmt: skip

    for name in ("auto", "eagle3-head"):
        head = create_draft_runtime(name, request(folder, tiny_target))
        assert isinstance(head, HeadDraftModel) and head.kv_pool.num_slots <= 64
        assert head.owns_vocab and head.uses_features
    with pytest.raises(ValueError, match="--target-model-path"):
        create_draft_runtime("auto", request(folder, None))
    for name in ("auto", "torch"):
        lm = create_draft_runtime(name, request(tiny_target, None))
        assert isinstance(lm, DraftModel) and not lm.owns_vocab and not lm.uses_features
    with pytest.raises(ValueError, match="it is an EAGLE-3 head"):
        create_draft_runtime("torch", request(folder, tiny_target))
    with pytest.raises(ValueError, match="it is not an EAGLE-3 head"):
        create_draft_runtime("eagle3-head", request(tiny_target, tiny_target))
    with pytest.raises(ValueError, match="unknown draft runtime 'onnx'; known: auto, torch"):
        create_draft_runtime("onnx", request(tiny_target, None))


def test_every_registered_runtime_implements_the_contract() -> None:
    """Each `runtime_registry.RUNTIMES` entry names a class with `create` and the `DraftRuntime`
    members (a runtime without its own vocabulary also takes `--ssd-draft-vocab`'s), and the
    flag offers exactly the registered names plus auto."""
    import importlib

    from sglang_ssd.config import FLAGS
    from sglang_ssd.runtime_registry import RUNTIMES
    from sglang_ssd.speculator.runtimes import DraftRuntime

    members = [n for n in dir(DraftRuntime) if not n.startswith("_")]
    members += list(DraftRuntime.__annotations__)
    for entry in RUNTIMES.values():
        module, name = entry.target.split(":")
        cls = getattr(importlib.import_module(module), name)
        assert callable(getattr(cls, "create", None)), entry
        missing = [
            m for m in members if not hasattr(cls, m) and m not in cls.__init__.__code__.co_names
        ]
        assert not missing, (entry.name, missing)
        if not cls.owns_vocab:
            assert callable(cls.use_vocab) and hasattr(cls, "eos_token_ids"), entry.name
    assert FLAGS["draft_runtime"].choices == ("auto", *RUNTIMES)

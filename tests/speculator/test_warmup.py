"""The speculator's warm-up round (`speculator.warmup`): it runs the serving shapes' forwards
(prefill, a jit chain of γ tokens, the async build's tree decode) and leaves the engine as it
found it: no request, no KV slot, no cache entry, counters at zero."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.speculator.warmup import warm_up
from sglang_ssd.testing.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("warmup") / "draft")


@pytest.mark.parametrize(("mode", "forwards"), [("async", 1 + 4 + 1 + 2), ("sync", 1 + 4)])
def test_the_warm_up_runs_the_serving_forwards_and_leaves_no_trace(
    draft: Path, mode: str, forwards: int
) -> None:
    """Forwards: the prompt's prefill, γ = 4 jit steps, and in async mode the build's glue and
    D = 2 tree-decode steps."""
    model = DraftModel.load(draft, dtype=torch.float32, num_slots=1024)
    engine = SpeculatorEngine(model, SSDConfig(lookahead=4, tree_depth=2, mode=mode), seed=0)
    before = engine.stats()
    seconds = warm_up(engine)
    assert seconds is not None and seconds > 0
    assert model.forward_count == forwards
    assert engine.stats() == before
    assert not engine.requests and engine.num_used_slots() == 0
    assert engine.phases.take() == {} and engine.build_forwards == 0

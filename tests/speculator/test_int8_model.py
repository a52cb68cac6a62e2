"""The "torch-int8" draft runtime (`speculator/int8_model.py`) on the tiny trained pair.

Its forwards against an HF reference with the same int8 layers (prefill, decode, tree decode)
are in `test_draft_model.py`, parametrised by runtime; here: it is built through the registry
with int8 layers really in place, its q is a distribution over the draft vocabulary, it drafts
as well as the float draft on the tiny pair, and it refuses what it cannot run on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from sglang_ssd.config import SSDConfig
from sglang_ssd.runtime_registry import LoadRequest
from sglang_ssd.speculator import int8_model
from sglang_ssd.speculator.draft_vocab import DraftVocab
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine
from sglang_ssd.speculator.int8_model import Int8DraftModel, int8_unavailable
from sglang_ssd.speculator.runtimes import create_draft_runtime, resolve
from sglang_ssd.testing.pair_stats import TYPICAL_PROMPTS, pair_stats

PROMPT = [40, 71, 72, 73, 0, 5, 9, 71, 72, 33, 34]


def _request(draft: Path, device: str = "cpu") -> LoadRequest:
    return LoadRequest(str(draft), None, device, "bfloat16", 4096, 0.5)


@pytest.fixture
def int8_draft(tiny_draft: Path) -> Int8DraftModel:
    model = create_draft_runtime("torch-int8", _request(tiny_draft))
    assert isinstance(model, Int8DraftModel)
    return model


def test_every_projection_and_the_head_run_in_int8(int8_draft: Int8DraftModel) -> None:
    linears = [m for m in int8_draft.base.modules() if isinstance(m, torch.nn.Linear)]
    int8 = [m for m in int8_draft.base.modules() if isinstance(m, DynamicInt8Linear)]
    assert not linears and len(int8) == 7 * int8_draft.num_layers
    assert isinstance(int8_draft._head(), DynamicInt8Linear)
    assert int8_draft.kv_pool.k[0].dtype == torch.float32


def test_sampled_drafts_carry_q_that_sums_to_one_on_the_draft_vocabulary(
    int8_draft: Int8DraftModel,
) -> None:
    """T > 0: the JIT draft's and the cache hit's q rows are distributions, zero outside a
    reduced draft vocabulary (the int8 head over the kept rows)."""
    kept = torch.arange(0, int8_draft.vocab_size, 2)
    int8_draft.use_vocab(DraftVocab(kept, int8_draft.vocab_size, "every other id"))
    engine = SpeculatorEngine(int8_draft, SSDConfig(lookahead=4, fanout_budget=6), seed=0)
    engine.open("r", PROMPT, temperature=0.8, top_k=-1, top_p=1.0, seed=1)
    outside = torch.ones(int8_draft.vocab_size, dtype=torch.bool)
    outside[kept] = False
    sources = []
    for _ in range(6):
        (draft,) = engine.serve(["r"], backup="jit", depth=4)
        engine.build(["r"])
        sources.append(draft.source)
        assert draft.q is not None
        torch.testing.assert_close(draft.q.sum(-1), torch.ones(4), atol=1e-5, rtol=0)
        assert bool((draft.q >= 0).all()) and not bool(draft.q[:, outside].any())
        branches = engine.requests["r"].branches
        assert branches is not None  # the outcome of the branch forked first: a cache hit
        engine.apply_outcomes([OutcomeIn("r", branches.ks[0], branches.bonus[0])])
    assert sources[0] == "jit" and set(sources[1:]) == {"cache"}
    engine.close("r")


def test_drafts_as_well_as_the_float_draft_on_the_tiny_pair(tiny_pair: tuple[Path, Path]) -> None:
    """Greedy SSD rounds with the int8 draft: the target's greedy output (the rounds verify
    against it), accept length within 0.3 of the float32 draft's on the same prompts."""
    prompts = TYPICAL_PROMPTS[:2]
    float32 = pair_stats(*tiny_pair, prompts=prompts, tokens=32)
    int8 = pair_stats(*tiny_pair, prompts=prompts, tokens=32, runtime="torch-int8")
    assert int8.outputs == float32.outputs
    assert abs(int8.accept_length - float32.accept_length) <= 0.3, (int8, float32)
    assert int8.hit_rate > 0


def test_it_refuses_a_gpu_and_names_the_flag(tiny_draft: Path) -> None:
    assert int8_unavailable("cpu") is None
    reason = int8_unavailable("cuda:0")
    assert reason is not None and "--ssd-draft-runtime torch-int8" in reason
    with pytest.raises(ValueError, match="CPU only"):
        create_draft_runtime("torch-int8", _request(tiny_draft, "cuda:0"))


def test_auto_picks_int8_on_the_cpu_and_bf16_torch_on_a_gpu(
    tiny_draft: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert resolve("auto", str(tiny_draft), "cpu") == "torch-int8"
    assert resolve("auto", str(tiny_draft), "cuda:0") == "torch"
    assert resolve("torch", str(tiny_draft), "cpu") == "torch"
    # A torch without FBGEMM (or, later, without torch.ao's int8 layers): bf16 torch, and why.
    monkeypatch.setattr(int8_model, "ENGINE", "an-engine-this-torch-lacks")
    with caplog.at_level("INFO", logger="sglang_ssd.speculator.runtimes"):
        assert resolve("auto", str(tiny_draft), "cpu") == "torch"
    assert "needs torch's an-engine-this-torch-lacks kernels" in caplog.text
    monkeypatch.setitem(sys.modules, "sglang_ssd.speculator.int8_model", None)
    assert resolve("auto", str(tiny_draft), "cpu") == "torch"

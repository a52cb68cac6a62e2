"""eval.bench_speculator's timing loops on tiny random models.

A build runs exactly 1 + D draft forwards (glue + one per tree depth), every (b, D, B) point and
batch size gets its samples, and the draft's KV pool is empty afterwards. The forward split
(`forward_split`) times every part of each tree forward and unhooks itself afterwards.
"""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from eval.bench_speculator import forward_split
from eval.bench_speculator.timing import bench_draft, bench_target
from eval.trace.target import HFTarget
from sglang_ssd.speculator.draft_model import ATTN_IMPLEMENTATION, DraftModel

PROMPT = [40, 71, 72, 73, 0, 5, 9, 71, 72, 33, 34]


def test_bench_workers_on_tiny_models(tiny_target, tiny_draft):
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=4096)
    prefixes = [PROMPT * 3, PROMPT[::-1] * 3]
    draft = bench_draft(
        model, prefixes, budgets=(1, 4), depths=(1, 2), batches=(1, 2), repeats=2, lookahead=4
    )
    points = draft["builds"]
    assert {(p["batch"], p["depth"], p["budget"]) for p in points} == {
        (b, d, f) for b in (1, 2) for d in (1, 2) for f in (1, 4)
    }
    for p in points:
        assert len(p["seconds"]) == 2 and all(s > 0 for s in p["seconds"])
        assert p["forwards"] == [1 + p["depth"]] * 2
        assert sum(p["fanout"]) == p["budget"]
    assert {j["batch"] for j in draft["jit"]} == {1, 2}
    assert all(j["forwards"] == [4] * 4 for j in draft["jit"])  # 2 repeats x 2 depths
    assert model.kv_pool.num_used == 0

    target = HFTarget(tiny_target, dtype=torch.float32)
    verify = bench_target(target, prefixes, batches=(1, 2), lookahead=4, repeats=3)
    assert {v["batch"] for v in verify} == {1, 2}
    assert all(len(v["seconds"]) >= 3 for v in verify)


def test_forward_split_times_every_part_of_the_tree_forwards(tiny_draft):
    model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=4096)
    attention = ALL_ATTENTION_FUNCTIONS[ATTN_IMPLEMENTATION]
    runs = {
        rows: forward_split.measure(model, PROMPT * 3, rows, depth=2, repeats=2) for rows in (1, 4)
    }
    for rows, run in runs.items():
        forwards = run["forwards"]
        assert [f["phase"] for f in forwards] == ["tree_1", "tree_2"] * 2
        assert (
            all(f["rows"] == 1 for f in forwards)
            if rows == 1
            else max(f["rows"] for f in forwards) > 1
        )
        for f in forwards:
            assert all(f[p] > 0 for p in ("matmuls", "attention", "norms", "rope", "lm_head"))
            assert f["body"] + f["lm_head"] <= f["forward"]
            assert f["rest"] >= 0, f  # the hooked parts lie inside the body
        shares = run["profiled"]
        assert 0 < shares["ops_share"] < 1 and shares["ops_share"] + shares["python_share"] == 1
        summary = forward_split.summarize(run, model)
        assert summary["floors"]["gmacs"] > 0 and summary["ms"]["forward"] > 0
    # Nothing stays wrapped: serving afterwards runs the plain model.
    assert ALL_ATTENTION_FUNCTIONS[ATTN_IMPLEMENTATION] is attention
    assert "forward" not in vars(model)
    assert model.kv_pool.num_used == 0


def test_compile_scopes_wrap_the_layer_parts_they_name(tiny_draft):
    """`forward_split --compile`: each scope wraps its modules' forwards (compiled at the first
    call, not here); "none" leaves the model as loaded; an unknown scope is refused."""

    def wrapped(module: torch.nn.Module) -> bool:
        return "forward" in vars(module)  # an instance attribute over the class's method

    for scope in forward_split.COMPILE_SCOPES:
        model = DraftModel.load(tiny_draft, dtype=torch.float32, num_slots=64)
        forward_split.compile_layers(model, scope)
        for layer in model.base.layers:
            parts = (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm)
            assert wrapped(layer) == (scope == "layer")
            assert all(wrapped(m) == (scope == "mlp-norms") for m in parts)
    with pytest.raises(ValueError, match="scope"):
        forward_split.compile_layers(model, "everything")

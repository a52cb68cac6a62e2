"""eval.bench_speculator's timing loops on tiny random models.

A build runs exactly 1 + D draft forwards (glue + one per tree depth), every (b, D, B) point and
batch size gets its samples, and the draft's KV pool is empty afterwards.
"""

from __future__ import annotations

import torch

from eval.bench_speculator.timing import bench_draft, bench_target
from eval.trace.target import HFTarget
from sglang_ssd.speculator.draft_model import DraftModel

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

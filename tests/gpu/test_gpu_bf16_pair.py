"""SSD rounds at shapes SGLang's CUDA backends take: a bf16 tiny pair with head dim 64 (and
128), so the speculator's branch attention runs FlashInfer's paged prefill where it is installed
(FlashInfer and FA3 refuse the float32, head-dim-16 pair of the other checks).

Checks: greedy rounds (engine + verify on CUDA, `ssd_round.Round`) emit the target's own greedy
continuation (AR by the same full forwards, one token at a time) up to bf16 near-ties; which
attention plan the draft ran (FlashInfer or the padded SDPA plan) is reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ssd_round import PROMPTS, Round, engine_on, make_pair, target_logits, target_on

import sglang_ssd.speculator.draft_model as draft_model

pytestmark = pytest.mark.gpu

ROUNDS = 6
BF16_MARGIN = 0.25  # a bf16 top-2 logit margin below this may flip between forward shapes


@pytest.fixture(scope="module", params=[64, 128], ids=["d64", "d128"])
def bf16_pair(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp(f"bf16-d{request.param}")
    return make_pair(root, dtype=torch.bfloat16, head_dim=request.param)


def test_bf16_greedy_rounds_equal_ar(
    cuda: torch.device, bf16_pair: tuple[Path, Path], monkeypatch, record_property
) -> None:
    draft_path, target_path = bf16_pair
    plans: list[str] = []
    plan = draft_model.plan_branch_attention

    def recorded(*args, **kwargs):
        made = plan(*args, **kwargs)
        plans.append(type(made).__name__)
        return made

    monkeypatch.setattr(draft_model, "plan_branch_attention", recorded)
    engine = engine_on(draft_path, cuda, dtype=torch.bfloat16)
    target = target_on(target_path, cuda, dtype=torch.bfloat16)
    run = Round(engine, target, [0.0, 0.0])
    run.open()
    gen = torch.Generator().manual_seed(0)
    for _ in range(ROUNDS):
        run.step(gen)
    ties = []
    for rid, prompt in zip(run.rids, PROMPTS, strict=False):
        emitted = run.emitted[rid]
        ar: list[int] = []
        for i in range(len(emitted)):
            logits = target_logits(target, prompt + ar, 0)[0, -1]
            ar.append(int(logits.argmax()))
            if ar[i] != emitted[i]:
                top = logits.topk(2).values
                margin = float(top[0] - top[1])
                assert margin < BF16_MARGIN, (
                    f"{rid}: token {i} SSD {emitted[i]} vs AR {ar[i]} at margin {margin:.3f}"
                )
                ties.append((rid, i, round(margin, 3)))
                break
    hits = sum(s == "cache" for srcs in run.sources for s in srcs)
    record_property(
        "detail",
        f"{ROUNDS} rounds, tokens {[len(t) for t in run.emitted.values()]}, hits {hits}, "
        f"plans {sorted(set(plans))}, near-ties {ties}",
    )
    assert hits > 0, "no cache hit in the bf16 rounds"

"""`sglang_ssd_kernels.branch_attention` on CPU and CUDA, and FlashInfer's custom-mask path.

Each is compared with the float64 dense reference computed on the CPU, on tree-decode-like
layouts (R requests, each a committed prefix, glue tokens up to a random fork depth and its own
branch tokens) for the 0.5B draft's heads and a Llama-like model's.
"""

from __future__ import annotations

import pytest
import torch
from sglang_ssd_kernels import branch_attention as module

pytestmark = pytest.mark.gpu

# (seed, (H, Hkv, d)): the 0.5B draft, a Llama-like model.
CONFIGS = [
    pytest.param(0, (14, 2, 64), id="H14-d64"),
    pytest.param(1, (32, 8, 128), id="H32-d128"),
]
STRATEGIES = ("padded", "segments")
# q, k, v, qo_indptr, kv_indptr, kv_indices, custom_mask (tensors), then S (int).
Layout = tuple


@pytest.mark.parametrize(("seed", "heads"), CONFIGS)
def test_cpu_matches_reference(seed: int, heads: tuple[int, int, int], record_property) -> None:
    case = _tree_layout(seed, *heads, torch.float32)
    worst = max(_max_error(case, strategy, torch.device("cpu")) for strategy in STRATEGIES)
    assert worst <= 1e-4, f"CPU fp32 H={heads[0]} d={heads[2]}: max error {worst:.2e}"
    record_property("detail", f"fp32 vs float64 dense reference: max error {worst:.2e}")


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 2e-4), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"]
)
@pytest.mark.parametrize(("seed", "heads"), CONFIGS)
def test_cuda_matches_reference(
    cuda: torch.device,
    seed: int,
    heads: tuple[int, int, int],
    dtype: torch.dtype,
    tol: float,
    record_property,
) -> None:
    case = _tree_layout(seed, *heads, dtype)
    for strategy in STRATEGIES:
        err = _max_error(case, strategy, cuda)
        assert err <= tol, f"CUDA {strategy} {dtype} H={heads[0]}: max error {err:.2e} > {tol}"
        record_property("detail", f"{strategy}: max error {err:.1e}")


@pytest.mark.parametrize(("seed", "heads"), CONFIGS)
def test_flashinfer_matches_reference(
    cuda: torch.device, seed: int, heads: tuple[int, int, int], record_property
) -> None:
    flashinfer = pytest.importorskip("flashinfer")
    case = _tree_layout(seed, *heads, torch.bfloat16)
    q, k, v, qo, kv, idx, mask, _ = case
    on_cuda = (t.to(cuda) for t in (q, k, v, qo, kv, idx, mask))
    out = module.branch_attention_flashinfer(*on_cuda, heads[2] ** -0.5)
    err = (out.cpu().double() - _reference(case)).abs().max().item()
    assert err <= 3e-2, f"FlashInfer H={heads[0]} d={heads[2]}: max error {err:.2e}"
    version = getattr(flashinfer, "__version__", "?")
    record_property("detail", f"flashinfer {version} bf16: max error {err:.1e}")


def _max_error(case: Layout, strategy: str, device: torch.device) -> float:
    """Largest |branch_attention - float64 reference| over the output, run on `device`."""
    q, k, v, qo, kv, idx, mask, _ = case
    on_device = (t.to(device) for t in (q, k, v, qo, kv, idx, mask))
    out = module.branch_attention(
        *on_device, q.shape[-1] ** -0.5, strategy=strategy, backend="sdpa"
    )
    return (out.cpu().double() - _reference(case)).abs().max().item()


def _reference(case: Layout) -> torch.Tensor:
    """float64 [N, H, d]: the dense reference on the CPU."""
    q, k, v, qo, kv, idx, mask, slots = case
    dense = module.dense_mask_from_layout(qo, kv, idx, mask, slots)
    return module.dense_reference(q.double(), k.double(), v.double(), dense, q.shape[-1] ** -0.5)


def _tree_layout(seed: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> Layout:
    """A tree-decode-like layout: R requests, each prefix + glue + branches, random fork depths.

    Returns q [N, H, d], k and v caches [S, Hkv, d] (all `dtype`), qo_indptr and kv_indptr int32
    [R + 1], kv_indices int32, the flat custom mask (bool) and S.
    """
    gen = torch.Generator().manual_seed(seed)
    num_slots = 4096
    perm = torch.randperm(num_slots, generator=gen)
    used = 0
    qo, kv, indices, masks = [0], [0], [], []
    for _ in range(4):
        prefix = int(torch.randint(50, 400, (1,), generator=gen))
        branches = int(torch.randint(1, 12, (1,), generator=gen))
        steps = int(torch.randint(1, 5, (1,), generator=gen))
        ctx = perm[used : used + prefix]
        used += prefix
        own = perm[used : used + branches * steps].view(branches, steps)
        used += branches * steps
        lens = torch.randint(prefix - 4, prefix + 1, (branches,), generator=gen)
        visible = torch.arange(prefix).unsqueeze(0) < lens.unsqueeze(1)
        own_mask = torch.eye(branches, dtype=torch.bool).repeat_interleave(steps, dim=1)
        masks.append(torch.cat([visible, own_mask], 1).reshape(-1))
        indices.append(torch.cat([ctx, own.reshape(-1)]))
        qo.append(qo[-1] + branches)
        kv.append(kv[-1] + prefix + branches * steps)
    q = torch.randn(qo[-1], heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    qo_indptr = torch.tensor(qo, dtype=torch.int32)
    kv_indptr = torch.tensor(kv, dtype=torch.int32)
    kv_indices = torch.cat(indices).to(torch.int32)
    return q, k, v, qo_indptr, kv_indptr, kv_indices, torch.cat(masks), num_slots


@pytest.mark.parametrize(("seed", "heads"), CONFIGS)
def test_auto_on_cuda_plans_flashinfer_once_for_every_layer(
    cuda: torch.device, seed: int, heads: tuple[int, int, int], record_property
) -> None:
    """On CUDA with flashinfer, `plan_branch_attention` is FlashInfer's paged
    prefill, planned at the first layer and reused by the others (as the draft model calls it)."""
    pytest.importorskip("flashinfer")
    from sglang_ssd_kernels.flashinfer_branch import FlashInferBranchPlan

    case = _tree_layout(seed, *heads, torch.bfloat16)
    q, k, v, qo, kv, idx, mask, _ = (t.to(cuda) if isinstance(t, torch.Tensor) else t for t in case)
    plan = module.plan_branch_attention(qo, kv, idx, mask, device=cuda)
    assert isinstance(plan, FlashInferBranchPlan)
    for _ in range(3):
        out = plan.run(q, k, v, heads[2] ** -0.5)
    assert plan.plans == 1, f"planned {plan.plans} times for 3 layers"
    err = (out.cpu().double() - _reference(case)).abs().max().item()
    assert err <= 3e-2, f"FlashInfer plan H={heads[0]}: max error {err:.2e}"
    record_property("detail", f"one plan, 3 runs: max error {err:.1e}")


def test_draft_model_attends_through_flashinfer(
    cuda: torch.device, tmp_path, monkeypatch: pytest.MonkeyPatch, record_property
) -> None:
    """A bf16 draft (head dim 64) on CUDA: each forward plans FlashInfer once, and its logits
    equal the same forward through SDPA within bf16 rounding."""
    pytest.importorskip("flashinfer")
    from sglang_ssd_kernels import flashinfer_branch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sglang_ssd.speculator import draft_model as dm

    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    model = dm.DraftModel.load(tmp_path, device=cuda, dtype=torch.bfloat16, num_slots=256)
    plans: list = []
    real_plan = dm.plan_branch_attention

    def recorded(*args, **kwargs):  # the real planner; records what it returned
        plans.append(real_plan(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(dm, "plan_branch_attention", recorded)

    def logits() -> torch.Tensor:
        n = 24
        slots = model.kv_pool.alloc(n)
        layout = dm.AttentionLayout(
            torch.tensor([0, n], dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32),
            slots.to(torch.int32), module.causal_custom_mask([n], [n]),
        )  # fmt: skip
        ids = torch.arange(3, 3 + n) % 512
        out = model.forward(ids, torch.arange(n), slots, layout)
        model.kv_pool.free(slots)
        return out

    through_flashinfer = logits()
    monkeypatch.setattr(module, "flashinfer_available", lambda: False)
    through_sdpa = logits()
    assert isinstance(plans[0], flashinfer_branch.FlashInferBranchPlan) and plans[0].plans == 1
    assert isinstance(plans[1], module.BranchAttentionPlan)
    err = (through_flashinfer - through_sdpa).abs().max().item()
    assert err <= 0.1, f"FlashInfer vs SDPA logits: max error {err:.2e}"
    record_property("detail", f"bf16 draft: FlashInfer vs SDPA logits max error {err:.1e}")

"""The FlashInfer branch-attention plan, checked on the CPU.

FlashInfer runs only on CUDA (`tests/gpu/test_gpu_branch_attention.py` runs the real kernel).
Here `ContractWrapper` stands where `flashinfer.BatchPrefillWithPagedKVCacheWrapper` stands: it
checks every argument against FlashInfer's documented contract for page_size = 1, NHD
(`plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
num_kv_heads, head_dim_qk, page_size, custom_mask=..., sm_scale=..., q_data_type=...)`, then
`run(q, (k_pages, v_pages))`; a request's KV length is (pages - 1) * page_size +
last_page_len), computes what that contract defines with the float64 dense reference, and
returns NaN for a row that sees no slot (FlashInfer leaves such rows undefined). So these tests
check what our plan passes and does around the kernel, not the kernel.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from sglang_ssd_kernels import branch_attention as module
from sglang_ssd_kernels import flashinfer_branch
from sglang_ssd_kernels.flashinfer_branch import FlashInferBranchPlan


class ContractWrapper:
    """FlashInfer's paged-prefill wrapper contract (page_size 1, NHD) on the CPU."""

    made: ClassVar[list[ContractWrapper]] = []

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.plans: list[dict] = []
        ContractWrapper.made.append(self)

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, heads, kv_heads, head_dim,
             page_size, *, custom_mask, causal, sm_scale, q_data_type, kv_data_type,
             head_dim_vo=None):  # fmt: skip
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr),
                        ("kv_indices", kv_indices), ("last_page_len", last_page_len)):  # fmt: skip
            assert t.dtype == torch.int32 and t.dim() == 1, f"{name}: int32 1-D, got {t.dtype}"
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr),
                        ("last_page_len", last_page_len)):  # fmt: skip
            assert t.device.type == "cpu", f"{name} must come from the host (no device sync)"
        batch = qo_indptr.numel() - 1
        assert kv_indptr.numel() == batch + 1 and last_page_len.numel() == batch
        assert page_size == 1 and bool((last_page_len == 1).all()), "page_size 1: last page 1"
        qo_lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
        kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).tolist()
        assert all(n > 0 for n in qo_lens), f"a request without query rows: {qo_lens}"
        assert all(n > 0 for n in kv_lens), f"a request without a page: {kv_lens}"
        assert kv_indptr[-1] == kv_indices.numel()
        if custom_mask is not None:
            assert custom_mask.dtype == torch.bool
            assert custom_mask.numel() == sum(a * b for a, b in zip(qo_lens, kv_lens, strict=True))
        assert causal is False
        self.plans.append(dict(qo=qo_indptr, kv=kv_indptr, idx=kv_indices, mask=custom_mask,
                               heads=(heads, kv_heads, head_dim, head_dim_vo or head_dim),
                               scale=sm_scale, dtypes=(q_data_type, kv_data_type)))  # fmt: skip

    def run(self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor]):
        planned = self.plans[-1]
        k_pages, v_pages = paged_kv_cache
        heads, kv_heads, head_dim, dv = planned["heads"]
        assert q.is_contiguous() and q.dtype == planned["dtypes"][0]
        assert q.shape[1:] == (heads, head_dim) and k_pages.dtype == planned["dtypes"][1]
        assert k_pages.shape[1:] == (1, kv_heads, head_dim)
        assert v_pages.shape[1:] == (1, kv_heads, dv)
        k, v = k_pages[:, 0], v_pages[:, 0]
        dense = module.dense_mask_from_layout(
            planned["qo"], planned["kv"], planned["idx"], planned["mask"], k.shape[0]
        )
        out = module.dense_reference(q, k, v, dense, planned["scale"])
        out[~dense.any(1)] = float("nan")  # undefined in FlashInfer
        return out


@pytest.fixture()
def contract(monkeypatch: pytest.MonkeyPatch) -> type[ContractWrapper]:
    ContractWrapper.made = []
    monkeypatch.setattr(flashinfer_branch, "make_wrapper", ContractWrapper)
    monkeypatch.setattr(flashinfer_branch, "_WRAPPERS", {})
    monkeypatch.setattr(flashinfer_branch, "qo_indptr_device", lambda: False)  # FlashInfer 0.7.2
    return ContractWrapper


def _layout(dtype: torch.dtype, head_dim: int = 64):
    """Three requests (one with no query rows) over a 200-slot cache; one row sees nothing.

    Returns q [N, 14, d], k and v [200, 2, d] in `dtype`, qo/kv indptr and slots (int32), the
    flat mask (bool) and the cache size.
    """
    gen = torch.Generator().manual_seed(7)
    qo_lens, kv_lens = [4, 0, 3], [37, 5, 52]
    slots = torch.randperm(200, generator=gen)[: sum(kv_lens)].to(torch.int32)
    pairs = zip(qo_lens, kv_lens, strict=True)
    blocks = [torch.rand(qo, kv, generator=gen) < 0.6 for qo, kv in pairs]
    blocks[2][1] = False  # a query that sees no slot
    q = torch.randn(sum(qo_lens), 14, head_dim, generator=gen).to(dtype)
    k = torch.randn(200, 2, head_dim, generator=gen).to(dtype)
    v = torch.randn(200, 2, head_dim, generator=gen).to(dtype)
    qo = torch.tensor([0, 4, 4, 7], dtype=torch.int32)
    kv = torch.tensor([0, 37, 42, 94], dtype=torch.int32)
    mask = torch.cat([b.reshape(-1) for b in blocks])
    return q, k, v, qo, kv, slots, mask, 200


def _reference(case) -> torch.Tensor:
    q, k, v, qo, kv, idx, mask, slots = case
    dense = module.dense_mask_from_layout(qo, kv, idx, mask, slots)
    return module.dense_reference(q.double(), k.double(), v.double(), dense, 0.125)


def test_one_plan_serves_every_layer_and_equals_the_reference(contract) -> None:
    case = _layout(torch.bfloat16)
    q, k, v, qo, kv, idx, mask, _ = case
    plan = module.plan_branch_attention(qo, kv, idx, mask, backend="flashinfer")
    assert isinstance(plan, FlashInferBranchPlan)
    outs = [plan.run(q, k * (1 + layer), v, 0.125) for layer in range(3)]
    (wrapper,) = contract.made
    assert len(wrapper.plans) == 1, "FlashInfer must be planned once per forward, not per layer"
    planned = wrapper.plans[0]
    assert planned["qo"].tolist() == [0, 4, 7]  # the request without queries is dropped
    assert planned["kv"].tolist() == [0, 37, 89]
    assert planned["idx"].tolist() == torch.cat([idx[:37], idx[42:]]).tolist()
    assert planned["heads"] == (14, 2, 64, 64) and planned["scale"] == 0.125
    assert torch.isfinite(outs[0]).all() and (outs[0][5] == 0).all()  # the row that sees nothing
    torch.testing.assert_close(outs[0].double(), _reference(case), atol=2e-2, rtol=0)
    sdpa = module.plan_branch_attention(qo, kv, idx, mask, backend="sdpa").run(q, k, v, 0.125)
    torch.testing.assert_close(outs[0], sdpa, atol=2e-2, rtol=0)
    plan.run(q, k, v, 0.25)  # another softmax scale is another plan
    assert len(wrapper.plans) == 2 and wrapper.plans[1]["scale"] == 0.25


@pytest.mark.parametrize(
    ("dtype", "head_dim"), [(torch.float32, 64), (torch.bfloat16, 16)], ids=["fp32", "d16"]
)
def test_outside_flashinfers_limits_the_padded_sdpa_plan_runs(
    contract, dtype: torch.dtype, head_dim: int
) -> None:
    case = _layout(dtype, head_dim)
    q, k, v, qo, kv, idx, mask, _ = case
    plan = module.plan_branch_attention(qo, kv, idx, mask, backend="flashinfer")
    out = plan.run(q, k, v, 0.125)
    assert contract.made == [], "no FlashInfer wrapper for a dtype or head dim it lacks"
    assert plan._fallback.strategy == "padded"
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), _reference(case), atol=tol, rtol=0)


def test_backend_choice_and_its_errors() -> None:
    q, k, v, qo, kv, idx, mask, _ = _layout(torch.float32)
    assert isinstance(module.plan_branch_attention(qo, kv, idx, mask), module.BranchAttentionPlan)
    with pytest.raises(ValueError, match="unknown backend"):
        module.plan_branch_attention(qo, kv, idx, mask, backend="xformers")
    empty = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="every segment with query rows to have a slot"):
        module.plan_branch_attention(
            empty, torch.tensor([0, 0], dtype=torch.int32), idx[:0], None, backend="flashinfer"
        )
    plan = module.plan_branch_attention(qo, kv, idx, mask, backend="flashinfer")
    with pytest.raises(RuntimeError, match=r"flashinfer|CUDA"):
        plan.run(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.125)  # no flashinfer or no CUDA


def test_on_cuda_sdpa_runs_one_padded_call_however_uneven_the_batch() -> None:
    """Without FlashInfer, CUDA runs the padded plan: one SDPA call, no per-request loop."""
    uneven_qo, uneven_kv = [1, 1, 1, 30], [8, 8, 8, 3000]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert module._choose_strategy("auto", uneven_qo, uneven_kv, cpu) == "segments"
    assert module._choose_strategy("auto", uneven_qo, uneven_kv, cuda) == "padded"
    assert module._choose_backend("auto", cpu, uneven_qo, uneven_kv) == "sdpa"


@pytest.mark.parametrize("installed", [True, False], ids=["flashinfer", "no-flashinfer"])
def test_auto_is_flashinfer_on_cuda_where_it_is_installed(
    monkeypatch: pytest.MonkeyPatch, installed: bool
) -> None:
    """The draft model and the head plan with backend "auto": on a CUDA device that is
    FlashInfer wherever the package imports and the layout fits it, SDPA otherwise."""
    monkeypatch.setattr(module, "flashinfer_available", lambda: installed)
    cuda = torch.device("cuda")
    expected = "flashinfer" if installed else "sdpa"
    assert module._choose_backend("auto", cuda, [3, 0, 2], [40, 5, 9]) == expected
    assert module._choose_backend("auto", cuda, [3, 2], [40, 0]) == "sdpa"  # queries, no slot
    assert module._choose_backend("auto", torch.device("cpu"), [3], [40]) == "sdpa"


def test_one_wrapper_per_device_replanned_for_each_forward(contract) -> None:
    """Forwards reuse the device's wrapper (and its workspace); each forward's plan re-plans
    it, and a plan whose wrapper another plan used since re-plans before it runs again."""
    q, k, v, qo, kv, idx, mask, _ = _layout(torch.bfloat16)
    first = module.plan_branch_attention(qo, kv, idx, mask, backend="flashinfer")
    out = first.run(q, k, v, 0.125)
    first.run(q, k, v, 0.125)  # another layer: no new plan
    shorter = torch.tensor([0, 37, 42, 93], dtype=torch.int32)  # the next forward's kv_indptr
    second = module.plan_branch_attention(qo, shorter, idx[:93], None, backend="flashinfer")
    second.run(q, k, v, 0.125)
    (wrapper,) = contract.made
    assert [p["kv"].tolist() for p in wrapper.plans] == [[0, 37, 89], [0, 37, 88]]
    again = first.run(q, k, v, 0.125)  # the wrapper holds `second`'s plan now
    assert len(wrapper.plans) == 3 and wrapper.plans[2]["kv"].tolist() == [0, 37, 89]
    assert torch.equal(again, out)


def test_host_indptr_is_the_running_sum_on_the_host() -> None:
    ptr = flashinfer_branch.host_indptr([4, 0, 3])
    assert ptr.tolist() == [0, 4, 4, 7] and ptr.dtype == torch.int32
    assert ptr.device.type == "cpu"
    assert flashinfer_branch.host_indptr([]).tolist() == [0]

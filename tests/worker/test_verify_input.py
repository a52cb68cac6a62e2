"""SSD's verify input as SGLang's attention backends read it (issue 31, item 1): the chain mask
in NGRAM's FULL layout, and FlashInfer's TARGET_VERIFY arguments built by SGLang's own
`NgramVerifyInput.generate_attn_arg_prefill` on CPU tensors (its Triton gather on Triton's CPU
interpreter), equal to what an NGRAM verify input of the same chain gives."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.worker.verify_input import SSDVerifyInput, build_verify_input, chain_mask

LENGTHS = [5, 1, 9]


def ngram_full_mask(seq_lens: list[int], tree_mask: torch.Tensor) -> torch.Tensor:
    """NGRAM's custom mask off the CPU, as `_prepare_for_speculative_decoding` builds it
    (sglang/srt/speculative/ngram_worker.py, 0.5.23, `USE_FULL_MASK`): per request, ones for
    the prefix beside its [W, W] tree mask, flattened and concatenated."""
    width = tree_mask.shape[-1]
    rows = [
        torch.cat((torch.ones(width, length), tree_mask[i].float()), dim=1).to(torch.bool).flatten()
        for i, length in enumerate(seq_lens)
    ]
    return torch.cat(rows)


@pytest.mark.parametrize("width", [1, 2, 5])
def test_chain_mask_is_ngrams_full_mask_of_a_chain(width: int) -> None:
    chain = torch.tril(torch.ones(width, width)).expand(len(LENGTHS), width, width)
    lengths = torch.tensor(LENGTHS)
    got = chain_mask(lengths, lengths, width)
    assert got.dtype == torch.bool
    assert torch.equal(got, ngram_full_mask(LENGTHS, chain))


def test_the_round_carries_the_mask_off_the_cpu_only() -> None:
    """`meta` stands in for CUDA: the verify input the worker builds off the CPU has the chain
    mask; on the CPU none (intel_amx reads none for a chain, and NGRAM gives it none there)."""
    lengths, width = torch.tensor(LENGTHS), 3
    ids = torch.zeros(width * len(LENGTHS), dtype=torch.int64)
    on_cpu = build_verify_input(ids, ids, lengths, lengths, width)
    assert on_cpu.custom_mask is None and on_cpu.draft_token_num == width
    meta = build_verify_input(ids.to("meta"), ids.to("meta"), lengths.to("meta"), lengths, width)
    assert meta.custom_mask is not None and meta.custom_mask.device.type == "meta"
    assert meta.custom_mask.numel() == width * (sum(LENGTHS) + width * len(LENGTHS))


def test_chain_mask_refuses_bad_arguments() -> None:
    lengths = torch.tensor(LENGTHS)
    with pytest.raises(ValueError, match="width"):
        chain_mask(lengths, lengths, 0)
    with pytest.raises(ValueError, match="lengths"):
        chain_mask(lengths, lengths[:2], 3)


def test_flashinfer_verify_arguments_equal_ngrams(
    sglang_world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FlashInfer's TARGET_VERIFY plan calls `spec_info.generate_attn_arg_prefill` with the
    batch's pool rows, committed lengths, the runner's `KVIndexTranslator` and the iteration's
    `KVLocPlan` (layers/attention/flashinfer_backend.py); SSD's input must give what NGRAM's gives
    for the same chain, and without a mask SGLang's method fails (the bug this fixes)."""
    from sglang.srt.mem_cache import kv_index_translator
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan
    from sglang.srt.speculative.ngram_info import NgramVerifyInput
    from sglang_source import triton_reference

    # SGLang's gather kernel, compiled from its installed source for Triton's CPU interpreter.
    gather = triton_reference(
        "kernels/ops/attention/kv_indices.py", "create_flashinfer_kv_indices_triton"
    )
    monkeypatch.setattr(kv_index_translator, "create_flashinfer_kv_indices_triton", gather)

    width, rows = 4, torch.tensor([2, 0, 3])
    lengths = torch.tensor(LENGTHS)
    req_to_token = torch.arange(4 * 32, dtype=torch.int32).view(4, 32)
    translator = KVIndexTranslator(
        req_to_token=req_to_token,
        token_to_kv_pool_allocator=object(),  # a plain pool: reads stay in req_to_token
        token_to_kv_pool=object(),
        page_size=1,
        device="cpu",
    )
    n = width * len(LENGTHS)
    common = dict(
        draft_token=torch.zeros(n, dtype=torch.int64),
        positions=torch.zeros(n, dtype=torch.int64),
        draft_token_num=width,
        new_seq_lens=lengths,
    )

    def arguments(spec) -> list[torch.Tensor]:
        plan = KVLocPlan(
            source=translator,
            req_pool_indices=rows,
            seq_lens=lengths,
            seq_lens_cpu=lengths,
            write_virtual=None,
        )
        return spec.generate_attn_arg_prefill(
            req_pool_indices=rows,
            paged_kernel_lens=lengths,
            paged_kernel_lens_sum=int(lengths.sum()),
            translator=translator,
            plan=plan,
        )

    chain = torch.tril(torch.ones(width, width)).expand(len(LENGTHS), width, width)
    ngram = NgramVerifyInput(custom_mask=ngram_full_mask(LENGTHS, chain), **common)
    ssd = SSDVerifyInput(custom_mask=chain_mask(lengths, lengths, width), **common)
    for got, want in zip(arguments(ssd), arguments(ngram), strict=True):
        assert torch.equal(got, want)
    kv_indices, kv_indptr, qo_indptr, mask = arguments(ssd)
    assert kv_indptr.tolist() == [0, 9, 14, 27] and qo_indptr.tolist() == [0, 4, 8, 12]
    assert kv_indices[:9].tolist() == list(range(64, 73))  # pool row 2: prefix + 4 verify slots
    assert mask.numel() == width * int(lengths.sum()) + width * width * len(LENGTHS)
    with pytest.raises(AttributeError):
        arguments(SSDVerifyInput(custom_mask=None, **common))
    assert ssd.tree_topk == 1 and ssd.max_tree_depth == width

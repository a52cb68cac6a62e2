"""SSD's verify input as SGLang's attention backends read it: the chain mask
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


def _verify_inputs(width: int) -> tuple:
    """SSD's and NGRAM's verify inputs of the same chain of `width` over `LENGTHS`."""
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    lengths, n = torch.tensor(LENGTHS), width * len(LENGTHS)
    common = dict(
        draft_token=torch.zeros(n, dtype=torch.int64),
        positions=torch.zeros(n, dtype=torch.int64),
        draft_token_num=width,
        new_seq_lens=lengths,
    )
    chain = torch.tril(torch.ones(width, width)).expand(len(LENGTHS), width, width)
    ssd = SSDVerifyInput(custom_mask=chain_mask(lengths, lengths, width), **common)
    return ssd, NgramVerifyInput(custom_mask=ngram_full_mask(LENGTHS, chain), **common)


def _backend(cls: type, width: int, **attrs: object) -> object:
    """An SGLang attention backend of `cls` with only the attributes its TARGET_VERIFY metadata
    path reads (no model runner): a server at γ + 1 = `width`, page size 1, four pool rows."""
    from types import SimpleNamespace

    backend = object.__new__(cls)
    req_to_token = torch.arange(4 * 32, dtype=torch.int32).view(4, 32)
    fields = dict(
        topk=1, speculative_num_draft_tokens=width, max_context_len=32, page_size=1,
        device="cpu", req_to_token=req_to_token, local_attn_builder=None,
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token), _kv_shard_pool=None,
        use_sliding_window_kv_pool=False, kv_index_translator=SimpleNamespace(is_translating=False),
    )  # fmt: skip
    for name, value in {**fields, **attrs}.items():
        setattr(backend, name, value)
    return backend


def _verify_batch(spec: object) -> object:
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    lengths = torch.tensor(LENGTHS)
    return SimpleNamespace(
        seq_lens=lengths, seq_lens_cpu=lengths, seq_lens_sum=int(lengths.sum()),
        batch_size=len(LENGTHS), forward_mode=ForwardMode.TARGET_VERIFY, spec_info=spec,
        req_pool_indices=torch.tensor([2, 0, 3]), encoder_lens=None,
    )  # fmt: skip


def test_fa3_verify_metadata_spans_ssds_rows_as_ngrams(sglang_world: None) -> None:
    """FA3 (and FA4, the same class) builds TARGET_VERIFY metadata from the static width γ + 1
    (`FlashAttentionBackend.init_forward_metadata`, layers/attention/flashattention_backend.py
    in SGLang 0.5.23), run here on CPU tensors: for SSD's input it equals NGRAM's and spans
    exactly the verify batch's rows; a width-1 (plain) round would be read at γ + 1 rows per
    request, which is why plain rounds are refused off the CPU."""
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

    width = 4
    got = []
    for spec in _verify_inputs(width):
        backend = _backend(FlashAttentionBackend, width)
        FlashAttentionBackend.init_forward_metadata(backend, _verify_batch(spec))
        got.append(backend.forward_metadata)
    ssd, ngram = got
    for name in ("cu_seqlens_q", "cache_seqlens_int32", "cu_seqlens_k", "page_table"):
        assert torch.equal(getattr(ssd, name), getattr(ngram, name)), name
    assert ssd.cu_seqlens_q.tolist() == [0, 4, 8, 12]  # = SSD's verify rows, width × requests
    assert ssd.cache_seqlens_int32.tolist() == [n + width for n in LENGTHS]
    plain, _ = _verify_inputs(1)
    backend = _backend(FlashAttentionBackend, width)
    FlashAttentionBackend.init_forward_metadata(backend, _verify_batch(plain))
    assert backend.forward_metadata.cu_seqlens_q[-1] == width * len(LENGTHS) != len(LENGTHS)


def test_triton_verify_metadata_is_ngrams(
    sglang_world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton's TARGET_VERIFY metadata (`TritonAttnBackend.init_forward_metadata`,
    layers/attention/triton_backend.py) reads the width from the input and the chain mask at
    `mask_indptr` offsets of W (L + W) per request; run on CPU tensors (its KV gather on
    Triton's CPU interpreter), SSD's input gives what NGRAM's gives, and the mask it indexes is
    exactly SSD's mask."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.mem_cache import kv_index_translator
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan
    from sglang_source import triton_reference

    gather = triton_reference(
        "kernels/ops/attention/kv_indices.py", "create_flashinfer_kv_indices_triton"
    )
    monkeypatch.setattr(kv_index_translator, "create_flashinfer_kv_indices_triton", gather)
    width, lengths = 4, torch.tensor(LENGTHS)
    got = []
    for spec in _verify_inputs(width):
        backend = _backend(
            TritonAttnBackend, width, dllm_attention=None, window_kv_indptr=None, dcp_size=1,
            sliding_window_size=None, kv_indptr=torch.zeros(8, dtype=torch.int32),
            mask_indptr=torch.zeros(8, dtype=torch.int64),
        )  # fmt: skip
        translator = KVIndexTranslator(
            req_to_token=backend.req_to_token, token_to_kv_pool_allocator=object(),
            token_to_kv_pool=object(), page_size=1, device="cpu",
        )  # fmt: skip
        batch = _verify_batch(spec)
        batch.kv_loc_plan = KVLocPlan(
            source=translator, req_pool_indices=batch.req_pool_indices, seq_lens=lengths,
            seq_lens_cpu=lengths, write_virtual=None,
        )  # fmt: skip
        backend.kv_index_translator = translator
        TritonAttnBackend.init_forward_metadata(backend, batch)
        got.append(backend.forward_metadata)
    ssd, ngram = got
    for name in ("qo_indptr", "kv_indptr", "kv_indices", "mask_indptr", "custom_mask"):
        assert torch.equal(getattr(ssd, name), getattr(ngram, name)), name
    assert ssd.mask_indptr[-1] == ssd.custom_mask.numel()
    assert ssd.qo_indptr.tolist() == [0, 4, 8, 12] and ssd.max_extend_len == width

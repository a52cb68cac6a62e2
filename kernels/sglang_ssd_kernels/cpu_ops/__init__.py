"""Pure-torch implementations of the `sgl_kernel` CPU ops on SGLang's dense-model CPU path.

Modules by concern: `attention` (paged decode/extend attention, registered as
`torch.ops.sgl_kernel.*` by `registry`), `kvcache` (req_to_token and KV-row bookkeeping),
`speculative` (EAGLE-family tree build/verify and accept bookkeeping), `ngram` (tree links from
an n-gram tree mask). Each op mirrors the contract of the Triton kernel or call site in the
pinned SGLang and is tested against it (tests/kernels/test_cpu_ops_*.py).
"""

from sglang_ssd_kernels.cpu_ops.attention import decode_attention_cpu, extend_attention_cpu
from sglang_ssd_kernels.cpu_ops.kvcache import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
)
from sglang_ssd_kernels.cpu_ops.ngram import reconstruct_indices_from_tree_mask
from sglang_ssd_kernels.cpu_ops.registry import register_torch_ops
from sglang_ssd_kernels.cpu_ops.speculative import (
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "register_torch_ops",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]

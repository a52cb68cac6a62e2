"""`sgl_kernel.speculative`: SGLang's n-gram worker imports `reconstruct_indices_from_tree_mask`
from here on CPU (kernels/ops/speculative/reconstruct_tree.py); other names raise when called."""

from collections.abc import Callable
from typing import NoReturn

from sglang_ssd_kernels.cpu_ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

from sgl_kernel._missing import missing_attr

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]


def __getattr__(name: str) -> Callable[..., NoReturn]:
    return missing_attr(__name__, name)

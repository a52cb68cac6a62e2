"""`sgl_kernel` for SGLang's CPU engine, backed by sglang-ssd's pure-torch ops.

Intel's CPU build of `sgl_kernel` is not on PyPI. This module provides what SGLang's CPU path
for dense models uses: the Python ops it imports (re-exported from
`sglang_ssd_kernels.cpu_ops`) and the `torch.ops.sgl_kernel.*` attention ops (registered on
import). Any other public name resolves to a placeholder that raises NotImplementedError when
called, so SGLang's unconditional module-level imports keep working.
"""

from collections.abc import Callable
from typing import NoReturn

from sglang_ssd_kernels.cpu_ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    register_torch_ops,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

from sgl_kernel import mamba, speculative
from sgl_kernel._missing import missing_attr

__version__ = "0.0.1+torchcpu"

register_torch_ops()

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "mamba",
    "reconstruct_indices_from_tree_mask",
    "rotate_input_ids_cpu",
    "speculative",
    "verify_tree_greedy_cpu",
]


def __getattr__(name: str) -> Callable[..., NoReturn]:
    return missing_attr(__name__, name)

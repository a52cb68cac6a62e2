"""`sgl_kernel.speculative`: SGLang's n-gram worker imports `reconstruct_indices_from_tree_mask`
from here on CPU (kernels/ops/speculative/reconstruct_tree.py); other names raise when called.

Like the real module it holds the speculative-decoding ops: every op of
`sglang_ssd_kernels.cpu_ops` but the attention ops, the KV row copy and the registration hook.
"""

from collections.abc import Callable
from typing import NoReturn

from sglang_ssd_kernels import cpu_ops

from sgl_kernel._missing import missing_attr

_NOT_SPECULATIVE = {
    "copy_all_layer_kv_cache_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "register_torch_ops",
}
__all__ = sorted(set(cpu_ops.__all__) - _NOT_SPECULATIVE)
globals().update({name: getattr(cpu_ops, name) for name in __all__})


def __getattr__(name: str) -> Callable[..., NoReturn]:
    return missing_attr(__name__, name)

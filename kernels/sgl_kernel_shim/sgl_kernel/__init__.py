"""`sgl_kernel` for SGLang's CPU engine, backed by sglang-ssd's pure-torch ops.

Intel's CPU build of `sgl_kernel` is not on PyPI. This module provides what SGLang's CPU path
for dense models uses: the Python ops it imports (every op of `sglang_ssd_kernels.cpu_ops`,
bound here as module attributes) and the `torch.ops.sgl_kernel.*` attention ops (registered on
import). Any other public name resolves to a placeholder that raises NotImplementedError when
called, so SGLang's unconditional module-level imports keep working.
"""

from collections.abc import Callable
from typing import NoReturn

from sglang_ssd_kernels import cpu_ops

from sgl_kernel import mamba, speculative
from sgl_kernel._missing import missing_attr

__version__ = "0.0.1+torchcpu"

cpu_ops.register_torch_ops()

# The attention ops are reached only as torch.ops.sgl_kernel.* (registered just above).
_OPS = sorted(
    set(cpu_ops.__all__) - {"decode_attention_cpu", "extend_attention_cpu", "register_torch_ops"}
)
globals().update({name: getattr(cpu_ops, name) for name in _OPS})

__all__ = [*_OPS, "mamba", "speculative"]


def __getattr__(name: str) -> Callable[..., NoReturn]:
    return missing_attr(__name__, name)

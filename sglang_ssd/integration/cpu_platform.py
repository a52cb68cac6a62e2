"""Make SGLang's speculative algorithms run on x86 CPUs that lack Intel AMX.

On CPU, SGLang builds draft/verify attention only for the `intel_amx` backend
(speculative/draft_utils.py) and its argument resolution swaps `intel_amx` for `torch_native`
when `get_platform().has_amx` is false (arg_groups/overrides.py). The `intel_amx` backend itself
only needs `torch.ops.sgl_kernel.{decode,extend}_attention_cpu`, which the pure-torch
`sgl_kernel` distribution in `kernels/` provides. Other AMX fast paths call
`cpu_has_amx_support()` directly, which stays false, so model layers keep `forward_native`.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def enable_cpu_speculative_backend() -> bool:
    """Override SGLang's `has_amx` platform fact when running SGLang's CPU engine without AMX.

    Returns:
        True when the override was installed, False when it was not needed (GPU, real AMX, or
        SGLang's CPU engine not selected with `SGLANG_USE_CPU_ENGINE=1`).
    """
    from sglang.srt.runtime_context import get_platform, override_platform
    from sglang.srt.utils.common import is_cpu

    if not is_cpu() or get_platform().has_amx:
        return False
    override_platform(has_amx=True).install()
    logger.debug("sglang-ssd: has_amx overridden so the intel_amx attention backend is usable")
    return True

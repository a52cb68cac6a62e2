"""SGLang general plugin (`sglang.srt.plugins` entry point `ssd`).

SGLang calls `load()` early in every process it starts (launcher, tokenizer manager, scheduler,
detokenizer). It must be cheap and idempotent; it imports SGLang lazily so that
`import sglang_ssd` keeps working with torch alone.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_loaded = False


def load() -> None:
    """Entry point: enable SGLang's speculative path on AMX-less CPUs, register `SSD` and
    its API hooks (request checks, admin endpoints, metrics; they act only on SSD servers),
    and the target's int8 method (`--quantization ssd_int8`)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from sglang_ssd.integration import hooks
    from sglang_ssd.integration.cpu_platform import enable_cpu_speculative_backend
    from sglang_ssd.integration.registration import register_ssd
    from sglang_ssd.target.int8_method import register as register_int8

    enable_cpu_speculative_backend()
    register_ssd()
    hooks.install()
    register_int8()

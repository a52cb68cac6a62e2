"""Saguaro: the pure-torch math of speculative speculative decoding (SSD).

Kumar, Dao, May, "Speculative Speculative Decoding", ICLR 2026, arXiv 2603.03251;
docs/design.md#saguaro holds the exact rules and the corrected formulas. No processes, no SGLang:
this package
imports with torch alone and runs on CPU or CUDA tensors (device follows the inputs).

The names below are loaded on first use (PEP 562), so that importing one submodule (e.g.
`draft_kinds`, which the standard-library-only `sglang_ssd.config` reads) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the submodule that defines it.
_HOMES = {
    "AcceptanceCounts": "acceptance",
    "Backup": "fallback",
    "BackupStats": "fallback",
    "CacheLookup": "cache",
    "FallbackPolicy": "fallback",
    "NgramSpeculator": "backups",
    "RandomSpeculator": "backups",
    "SamplingBatch": "sampling",
    "SparseProbs": "cache",
    "SpeculationCache": "cache",
    "VerifyResult": "verify",
    "VerifyUniforms": "uniforms",
    "alpha_from_accept_length": "acceptance",
    "apply_sampling": "sampling",
    "expected_accept_length": "acceptance",
    "expected_speedup": "speedup",
    "filter_order": "sampling",
    "fit_hit_counts": "fanout",
    "fit_hit_model": "fanout",
    "geometric_fanout": "fanout",
    "hit_rate": "fanout",
    "saguaro_probs": "sampling",
    "top_m_from_fanout": "sampling",
    "uniform_fanout": "fanout",
    "verify": "verify",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """The public `name`, imported from its submodule on first use.

    Importing a submodule binds its name in this package (Python's import system), which would
    shadow a public name spelled like it: `verify` the function lives in `verify` the module. So
    after each import such a name is bound to the function again; without that, `from
    sglang_ssd.saguaro import VerifyResult, verify` gave the module.
    """
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOMES[name]
    module = importlib.import_module(f".{home}", __name__)
    globals()[name] = getattr(module, name)
    if _HOMES.get(home) == home:  # the submodule's own name is one of its public names
        globals()[home] = getattr(module, home)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})

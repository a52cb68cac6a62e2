"""Which float format suits this CPU: bf16 where it has bf16 instructions, else float32.

torch's CPU bf16 matmuls run on AVX512_BF16 / AMX instructions; without them (e.g. an AVX2-only
AMD EPYC) they fall back to a slow path. Measured on such a machine (one core, a [5, 1536] x
[1536, 8960] matmul, the Qwen2.5-1.5B MLP shape): bf16 249 ms, float32 31 ms. So on a CPU
without them the launcher serves in float32 unless `--dtype` is given, and the speculator runs
its draft in the target's format. Exactness does not depend on either (DESIGN.md §3b).
"""

from __future__ import annotations

import functools
from pathlib import Path

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The first processor's feature flags from /proc/cpuinfo text (read when not given);
    empty when there is none (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@functools.cache
def has_native_bf16() -> bool:
    """Whether this CPU has bf16 matmul instructions (AVX512_BF16 or AMX-BF16)."""
    return bool(cpu_flags() & BF16_FLAGS)


def default_cpu_dtype() -> str:
    """SGLang's `--dtype` for a CPU server when none is given: "auto" (the checkpoint's, bf16
    for the real pair) with native bf16, else "float32"."""
    return "auto" if has_native_bf16() else "float32"

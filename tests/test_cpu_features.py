"""sglang_ssd.cpu_features: bf16 only where the CPU has bf16 instructions, and the launcher's
`--dtype` default that follows from it."""

from __future__ import annotations

import pytest

from sglang_ssd import cpu_features, launch_server

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx fma f16c avx2\n\nprocessor\t: 1\nflags\t\t: x\n"
AMX = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_cpu_flags_reads_the_first_processor() -> None:
    assert cpu_features.cpu_flags(AVX2) == {"fpu", "sse2", "avx", "fma", "f16c", "avx2"}
    assert cpu_features.cpu_flags("no flags line") == frozenset()
    assert cpu_features.cpu_flags(AMX) & cpu_features.BF16_FLAGS == {"avx512_bf16", "amx_bf16"}


@pytest.mark.parametrize(("native", "dtype"), [(True, None), (False, "float32")])
def test_launcher_dtype_default_follows_bf16_support(
    monkeypatch: pytest.MonkeyPatch, native: bool, dtype: str | None
) -> None:
    monkeypatch.setattr(cpu_features, "has_native_bf16", lambda: native)
    argv = launch_server.apply_defaults(["--model-path", "m"], cuda=False, environ={})
    assert launch_server.flag_value(argv, "--dtype") == dtype
    given = ["--model-path", "m", "--dtype", "bfloat16"]
    argv = launch_server.apply_defaults(given, cuda=False, environ={})
    assert launch_server.flag_value(argv, "--dtype") == "bfloat16"  # the user's choice wins
    argv = launch_server.apply_defaults(["--model-path", "m"], cuda=True, environ={})
    assert launch_server.flag_value(argv, "--dtype") is None  # CUDA: SGLang's default

"""`eval.bench_speculator.kernels`: the projection shapes it times are the draft's, and each
kernel's chain runs and is timed against its weight bytes' floor (tiny shapes, one repeat)."""

from __future__ import annotations

import pytest

from eval.bench_speculator import kernels

QWEN2_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "num_hidden_layers": 24,
    "vocab_size": 151936,
}


def test_projection_shapes_of_the_real_draft() -> None:
    shapes = kernels.projection_shapes(QWEN2_05B, 65536)
    assert len(shapes) == 7 * 24 + 1
    assert shapes[:7] == [(896, 896), (128, 896), (128, 896), (896, 896),
                          (4864, 896), (4864, 896), (896, 4864)]  # fmt: skip
    assert shapes[-1] == (65536, 896)
    assert kernels.projection_shapes(QWEN2_05B, 0)[-1] == (151936, 896)
    # 0.5B: 357.9 M projection weights + the reduced head's 58.7 M
    assert sum(o * i for o, i in shapes) == 24 * 14_909_440 + 65536 * 896


def test_every_kernel_runs_the_chain_and_gets_a_floor() -> None:
    shapes = [(256, 128), (128, 256), (512, 128)]
    out = kernels.measure(shapes, rows=[1, 8], repeats=1, kernels=list(kernels.KERNELS))
    assert out["read_gb_per_s"] > 0
    for name, got in out["kernels"].items():
        if "error" in got:  # a kernel this torch build lacks is reported, not fatal
            continue
        assert set(got["ms"]) == {"1", "8"} and all(v > 0 for v in got["ms"].values()), name
        assert got["floor_ms"] > 0 and got["weight_mb"] > 0, name
    assert "error" not in out["kernels"]["bf16"] and "error" not in out["kernels"]["fbgemm-int8"]
    int8, bf16 = out["kernels"]["fbgemm-int8"], out["kernels"]["bf16"]
    assert int8["weight_mb"] == pytest.approx(bf16["weight_mb"] / 2)

"""The target's int8 matmul (`sglang_ssd.target.int8_kernel`): each row's result depends on
that row alone, bit for bit (a verify of γ + 1 rows must reproduce a one-row decode), and it
stays within int8's error of the float matmul."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.target.int8_kernel import (
    QMAX,
    int8_linear,
    kernel_unavailable,
    pack_rows,
    quantize_rows,
)


def _weights(n: int = 96, k: int = 160) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, k, generator=gen) * 0.05, torch.randn(n, generator=gen)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [5, 20])
def test_a_row_in_a_batch_equals_the_row_alone(dtype: torch.dtype, rows: int) -> None:
    w, b = _weights()
    packed = pack_rows(*quantize_rows(w))
    # Rows of very different magnitudes: a scale shared across rows would change the others.
    x = torch.randn(rows, w.shape[1]) * torch.logspace(-2, 2, rows)[:, None]
    x, bias = x.to(dtype), b.to(dtype)
    batch = int8_linear(x, packed, bias)
    for i in range(rows):
        assert torch.equal(batch[i : i + 1], int8_linear(x[i : i + 1], packed, bias)), i
    # Leading dimensions are flattened and restored.
    assert torch.equal(int8_linear(x.reshape(1, rows, -1), packed, bias)[0], batch)


def test_within_int8_error_of_the_float_matmul_and_inputs_untouched() -> None:
    w, b = _weights()
    before = w.clone()
    packed = pack_rows(*quantize_rows(w))
    x = torch.randn(7, w.shape[1])
    x_before = x.clone()
    got = int8_linear(x, packed, b)
    want = x @ w.T + b
    assert torch.equal(w, before) and torch.equal(x, x_before)
    assert got.dtype == x.dtype and got.shape == want.shape
    assert (got - want).abs().max() <= 0.02 * (want - b).abs().max()


def test_quantize_rows_codes_scales_and_zero_rows() -> None:
    w, _ = _weights()
    w[3] = 0
    q, scale = quantize_rows(w.bfloat16())
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (w.shape[0],)
    assert int(q.abs().max()) == QMAX and not q[3].any() and scale[3] > 0
    assert (q.float() * scale[:, None] - w).abs().max() <= scale.max() / 2 + 1e-3


def test_empty_batch_and_this_machine_has_the_kernel() -> None:
    assert kernel_unavailable() is None
    w, _ = _weights()
    packed = pack_rows(*quantize_rows(w))
    assert int8_linear(torch.empty(0, w.shape[1]), packed).shape == (0, w.shape[0])

"""Per-row int8 matmul on the CPU: int8 weights (one scale per output row) times int8
activations (one scale per input row), accumulated exactly in int32.

`y[i, j] ≈ sx[i] * sw[j] * sum_k qx[i, k] * qw[j, k]`, with `sx[i]` from row i's largest |x|
and `sw[j]` from weight row j's. Every factor of row i depends on row i alone and the integer
sum is exact, so a row's result is bit for bit the same whether it is computed alone (a
decode) or beside other rows (a verify of γ + 1 rows: paper §3's lossless check compares
them). FBGEMM's dynamic int8 linear alone would not do: it quantises its input with one scale
per call, so a row's codes move with the rows beside it.

The GEMM is FBGEMM's (`quantized::linear_dynamic` on a prepacked weight; VNNI where the CPU
has it). Per-row scales are given to it by dividing each row by its largest |x| and appending
two anchor rows, +1 and -1: every call then sees the range [-1, 1] exactly, so FBGEMM's
per-call scale and zero point are the same constants whatever the batch, and each row's codes
are its own. The output rows are multiplied back by their scales. (`torch._int_mm`, oneDNN's
int8 GEMM, was the slower choice on the verify shapes:
docs/benchmarks.md#the-int8-kernel-chosen-by-measurement-on-the-verify-shapes.)
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

ENGINE = "fbgemm"  # torch's x86 int8 kernels (`torch.backends.quantized.supported_engines`)
# 7-bit activation codes, as torch's x86 dynamic quantisation uses: without VNNI, FBGEMM's
# u8 x s8 pair sums saturate int16 at 8 bits.
REDUCE_RANGE = True
QMAX = 127  # symmetric: -127..127, so a scale maps max |x| to exactly 127
_TINY = torch.finfo(torch.float32).tiny
_CHUNK_ROWS = 8192  # weight rows quantised at a time (bounds the float32 copy)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of `weight` [N, K] (any float dtype) with one scale per row.

    Returns:
        (int8 [N, K], float32 [N] scales), with `weight ≈ q * scale[:, None]`; an all-zero row
        gets the smallest normal scale and zero codes.
    """
    q = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scale = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for start in range(0, weight.shape[0], _CHUNK_ROWS):
        rows = weight[start : start + _CHUNK_ROWS].float()
        s = rows.abs().amax(1).clamp_(min=_TINY).div_(QMAX)
        q[start : start + _CHUNK_ROWS] = (rows / s[:, None]).round_().clamp_(-QMAX, QMAX)
        scale[start : start + _CHUNK_ROWS] = s
    return q, scale


def pack_rows(q: torch.Tensor, scale: torch.Tensor) -> Any:
    """FBGEMM's prepacked weight of int8 codes `q` [N, K] with float32 row scales `scale` [N]
    (`quantize_rows`): an opaque object that `int8_linear` takes."""
    torch.backends.quantized.engine = ENGINE
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch's deprecation of quantised tensors (FBGEMM's input)
        warnings.simplefilter("ignore", UserWarning)
        weight = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
    return torch.ops.quantized.linear_prepack(weight, None)


@functools.cache
def _anchors(k: int) -> torch.Tensor:
    """The two rows (+1s and -1s, float32 [2, k]) that pin FBGEMM's input range to [-1, 1]."""
    return torch.stack([torch.ones(k), -torch.ones(k)])


def int8_linear(x: torch.Tensor, packed: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ W.T + bias` with `W` the int8 weight `packed` (`pack_rows`), `x` quantised per row.

    Args:
        x: [..., K] activations (bf16, fp16 or float32).
        packed: `pack_rows`'s weight, N rows of K.
        bias: [N] or None, added in `x.dtype`.

    Returns:
        [..., N] in `x.dtype`; row i depends on x's row i only (see the module).
    """
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).float()
    sx = x2.abs().amax(1, keepdim=True).clamp_(min=_TINY)
    anchored = torch.cat([x2 / sx, _anchors(shape[-1])])
    out = torch.ops.quantized.linear_dynamic(anchored, packed, REDUCE_RANGE)[: x2.shape[0]]
    out = out.mul_(sx).to(x.dtype)
    if bias is not None:
        out += bias
    return out.reshape(*shape[:-1], out.shape[-1])


def kernel_unavailable() -> str | None:
    """Why `int8_linear` cannot run in this torch on this CPU, or None when it can."""
    engines = torch.backends.quantized.supported_engines
    if ENGINE not in engines:
        have = ", ".join(engines)
        return f"torch {torch.__version__} lacks FBGEMM's int8 kernels (it has {have})"
    return None

"""The "torch-int8-onednn" draft runtime: "torch-int8" with oneDNN's int8 matmuls (CPU only).

The same quantisation as "torch-int8" (`speculator.int8_model`): int8 weights with one scale per
output row, float32 activations quantised to uint8 per call with one scale and zero point
(`torch.quantize_per_tensor_dynamic`), int32 accumulation, float32 output; embeddings, norms,
RoPE, attention and the KV pool stay float32. Only the kernel differs: oneDNN's
`qlinear_pointwise` on weights prepacked once (`onednn.qlinear_prepack`), which uses AMX's int8
tiles where the CPU has them, where FBGEMM's kernels stop at AVX-512 VNNI.

Measured on one core of the 2-core Intel Xeon with AMX (`python -m eval.bench_speculator.kernels`,
the 0.5B draft's 168 projections + its 65,536-row head, `eval/results/kernels-xeon-amx.json`):
at 8 rows (a B = 8 tree forward) oneDNN 50.0 ms against FBGEMM's 61.2 ms (a second run: 46.5
against 80.0), at 1 row 46.3 against 38.2 (42.8 against 50.6); the weights' streaming floor is
35 ms there. So `--ssd-draft-runtime auto` picks it on CPUs with AMX (`amx_int8`) and FBGEMM's
"torch-int8" elsewhere, where it was not measured.

Exactness is untouched, as for every runtime: the speculator sends the q it sampled from and the
target verifies against that q (paper §3).
"""

from __future__ import annotations

import torch

from sglang_ssd.speculator.int8_model import Int8DraftModel


def onednn_int8_unavailable(device: str) -> str | None:
    """Why the oneDNN int8 runtime cannot run on `device` ("cpu", "cuda:N"), or None."""
    if not device.startswith("cpu"):
        return f"--ssd-draft-runtime torch-int8-onednn runs on the CPU only, not on {device}"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.onednn, "qlinear_prepack"):
        return "--ssd-draft-runtime torch-int8-onednn needs a torch built with oneDNN (mkldnn)"
    return None


def cpu_has_amx_int8() -> bool:
    """Whether this CPU has AMX's int8 tiles (the `amx_int8` flag of /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


class OneDnnInt8Linear(torch.nn.Module):
    """y = x Wᵀ + b with int8 W (one scale per output row) prepacked for oneDNN, x quantised per
    call to uint8 (one scale and zero point over the call's rows); float32 in and out.

    Args:
        weight: float [out, in].
        bias: float [out] or None.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(1).clamp(min=1e-8) / 127
        q = (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8)
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.packed = torch.ops.onednn.qlinear_prepack(q, None)
        self.w_scale = scale
        self.w_zero = torch.zeros(w.shape[0], dtype=torch.int64)
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float32 [..., out] of float32 `x` [..., in]."""
        flat = x.reshape(-1, self.in_features).float()
        qx = torch.quantize_per_tensor_dynamic(flat, torch.quint8, False)
        y = torch.ops.onednn.qlinear_pointwise(
            qx.int_repr(), qx.q_scale(), qx.q_zero_point(), self.packed, self.w_scale,
            self.w_zero, self.bias, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        return y.reshape(*x.shape[:-1], self.out_features)


def replace_linears(module: torch.nn.Module) -> torch.nn.Module:
    """`module` with every `nn.Linear` replaced in place by a `OneDnnInt8Linear` of it."""
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, OneDnnInt8Linear(child.weight, child.bias))
        else:
            replace_linears(child)
    return module


class OneDnnInt8DraftModel(Int8DraftModel):
    """`Int8DraftModel` whose int8 layers run oneDNN's kernels (see the module)."""

    @staticmethod
    def unavailable(device: str) -> str | None:
        return onednn_int8_unavailable(device)

    @staticmethod
    def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Module:
        return OneDnnInt8Linear(weight, bias)

    def quantize(self) -> None:
        """Replace the decoder's linear layers by oneDNN int8 ones, in place (the LM head as in
        `Int8DraftModel.quantize`)."""
        replace_linears(self.base)

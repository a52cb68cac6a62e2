"""The "torch-int8" draft runtime: the torch runtime with int8 weights (CPU only).

Every `nn.Linear` of the draft (the decoder's projections and the LM head, reduced to the draft
vocabulary when one is set) becomes torch's dynamically quantised linear: int8 weights, one
scale per output row, and activations quantised per call (`torch.ao.nn.quantized.dynamic.Linear`
on FBGEMM, whose kernels use VNNI where the CPU has it and AVX2 otherwise). The rest of the
model (embeddings, norms, RoPE, attention over the paged pool) runs in float32, so the KV pool
is float32 too.

Why: one tree forward of the 0.5B draft streams its weights, and int8 halves bf16's bytes (on
a CPU without AVX512-BF16, bf16 matmuls have no native instructions at all); the kernels
compared: docs/benchmarks.md#draft-runtimes.

Exactness is untouched: the speculator sends the q it sampled from, whatever precision made it,
and the target's verification against that q is exact (paper §3). Activations are quantised with
one scale per call, so a row's logits move slightly with the other rows of its forward (within
the int8 error): trees and single branches agree to that precision, not bit for bit.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

from sglang_ssd.speculator.draft_model import DraftModel

if TYPE_CHECKING:
    from sglang_ssd.runtime_registry import LoadRequest
    from sglang_ssd.speculator.draft_vocab import DraftVocab

ENGINE = "fbgemm"  # torch's x86 int8 kernels (`torch.backends.quantized.supported_engines`)


def int8_unavailable(device: str) -> str | None:
    """Why the int8 runtime cannot run on `device` ("cpu", "cuda:N"), or None when it can."""
    if not device.startswith("cpu"):
        return f"--ssd-draft-runtime torch-int8 runs on the CPU only, not on {device}"
    if ENGINE not in torch.backends.quantized.supported_engines:
        return (
            f"--ssd-draft-runtime torch-int8 needs torch's {ENGINE} kernels, which this torch "
            f"build lacks (it has {', '.join(torch.backends.quantized.supported_engines)})"
        )
    return None


def quantize_linears(module: torch.nn.Module) -> torch.nn.Module:
    """`module` with every float32 `nn.Linear` replaced in place by torch's dynamically quantised
    linear (`torch.ao.nn.quantized.dynamic.Linear`): int8 weights with one scale per output row,
    float32 activations quantised to uint8 with one scale per call, int32 accumulation, float32
    output. Quiet about torch's deprecation of the API (torchao's replacement runs 3-10x slower
    than bf16 without `torch.compile`; see the module docstring)."""
    torch.backends.quantized.engine = ENGINE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return quantize_dynamic(
            module, {torch.nn.Linear: per_channel_dynamic_qconfig}, inplace=True
        )


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Module:
    """An int8 linear layer of float `weight` [out, in] (and `bias` [out] or None)."""
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
    if bias is not None:
        linear.bias = torch.nn.Parameter(bias.detach(), requires_grad=False)
    return quantize_linears(torch.nn.Sequential(linear))[0]


class Int8DraftModel(DraftModel):
    """`DraftModel` with int8 linear layers and float32 everything else (see the module).

    The float LM head stays (for a tied head, as most small drafts have, it is the embedding
    table, which stays anyway); the head that runs is an int8 copy of its rows, of the kept
    rows once a draft vocabulary is set."""

    _int8_head: torch.nn.Module | None = None

    @classmethod
    def create(cls, request: LoadRequest) -> Int8DraftModel:
        """The "torch-int8" runtime (`speculator.runtimes`): `request`'s folder loaded in float32
        (whatever `request.dtype` says: int8 kernels take float32 activations), then quantised.

        Raises:
            ValueError: on a device other than the CPU, or a torch without FBGEMM.
            FileNotFoundError, NotImplementedError: as `DraftModel.load`.
        """
        reason = int8_unavailable(request.device)
        if reason is not None:
            raise ValueError(reason)
        model = cls.load(
            request.model_path,
            device=request.device,
            dtype=torch.float32,
            num_slots=request.kv_slots,
            memory_share=request.memory_share,
        )
        model.quantize()
        return model

    def quantize(self) -> None:
        """Replace the decoder's linear layers by int8 ones, in place; the int8 LM head is
        built at the first forward (`_head`: the speculator sets its draft vocabulary before
        that, so the full head's rows are never quantised for nothing)."""
        quantize_linears(self.base)

    def use_vocab(self, vocab: DraftVocab | None) -> None:
        """As `DraftModel.use_vocab`; the head that runs is int8 (over the kept rows).

        Raises:
            ValueError: as `DraftModel.use_vocab`.
        """
        super().use_vocab(vocab)
        self._int8_head = None

    def _head(self) -> torch.nn.Module:
        """The int8 LM head over the kept rows (all rows without a draft vocabulary)."""
        if self._int8_head is None:
            bias = getattr(self.lm_head, "bias", None)
            if self._head_ids is None:
                self._int8_head = int8_linear(self.lm_head.weight, bias)
            else:
                assert self._head_weight is not None
                kept_bias = None if bias is None else bias.index_select(0, self._head_ids)
                self._int8_head = int8_linear(self._head_weight, kept_bias)
                self._head_weight = None  # the float copy of the kept rows is not needed
        return self._int8_head

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 [M, V] logits of `hidden` [M, hidden]; -inf outside a reduced vocabulary."""
        logits = self._head()(hidden).float()
        if self._head_ids is None:
            return logits
        out = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        return out.index_copy_(1, self._head_ids, logits)

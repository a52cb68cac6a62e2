"""What SSD's TARGET_VERIFY forward hands SGLang's attention backends: `SSDVerifyInput`, SGLang's
NGRAM verify input with a chain topology [root, d_1 .. d_{W-1}] per request, and its mask.

Backends read the verify input in their TARGET_VERIFY paths (SGLang 0.5.23, installed package):
- FlashInfer (`layers/attention/flashinfer_backend.py`, the prefill indices updater's
  `call_begin_forward`) calls `spec_info.generate_attn_arg_prefill(...)`, which for an
  `NgramVerifyInput` (`speculative/ngram_info.py`) sizes and pads `self.custom_mask` to
  `paged_kernel_lens_sum * W + W^2 * B` cells: without a mask it raises on `.numel()`;
- Triton (`layers/attention/triton_backend.py`, `init_forward_metadata`, target verify) passes
  `spec_info.custom_mask` with `mask_indptr` from `W * (seq_lens + W)` per request, the same
  layout;
- intel_amx on the CPU (`layers/attention/intel_amx_backend.py`) reads the mask only when
  `tree_topk != 1`, and plain causal masking is exact for a chain.

The mask is NGRAM's FULL layout (`speculative/ngram_worker.py`,
`_prepare_for_speculative_decoding`, used on every device but the CPU): per request, W rows
(query positions L .. L + W - 1, L its committed length) of L + W columns, row-major, all prefix
columns visible and verify column j visible from row j on. SSD's verify forwards run without
CUDA graphs (`integration.registration.disable_verify_cuda_graphs` says why), so the mask is
built each round at its exact size.
"""

from __future__ import annotations

import torch
from sglang.srt.speculative.ngram_info import NgramVerifyInput


def chain_mask(seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, width: int) -> torch.Tensor:
    """The verify mask of a chain of `width` positions after each request's committed tokens.

    Args:
        seq_lens: int [B] committed lengths L_b, on the target's device.
        seq_lens_cpu: the same lengths on the CPU (they size the mask without a device sync).
        width: W >= 1, verify positions per request (root + W - 1 drafts).

    Returns:
        bool [Σ_b W (L_b + W)] on `seq_lens`' device: request b's block is row-major [W, L_b + W],
        cell (i, c) True iff c <= L_b + i (the prefix and the chain up to position i).

    Raises:
        ValueError: if `width` < 1 or the two length tensors disagree in size.

    Source: sglang/srt/speculative/ngram_worker.py (0.5.23), FULL mask of a chain tree.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    if seq_lens.numel() != seq_lens_cpu.numel():
        raise ValueError(f"{seq_lens.numel()} lengths on the device, {seq_lens_cpu.numel()} on CPU")
    device = seq_lens.device
    lengths = seq_lens.to(torch.int64)
    cols = lengths + width
    cells = width * cols
    total = int((width * (seq_lens_cpu.to(torch.int64) + width)).sum())
    owner = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=device), cells, output_size=total
    )
    local = torch.arange(total, device=device) - (torch.cumsum(cells, 0) - cells)[owner]
    return local % cols[owner] <= lengths[owner] + local // cols[owner]


def build_verify_input(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    width: int,
) -> SSDVerifyInput:
    """The verify input of one round: `input_ids` / `positions` int64 [B * W] on the target's
    device, the committed lengths `seq_lens` [B] there and on the CPU, W = `width`. Off the CPU
    it carries `chain_mask` (FlashInfer and Triton read it); on the CPU none, as for NGRAM
    there (intel_amx masks a chain causally)."""
    on_cpu = seq_lens.device.type == "cpu"
    return SSDVerifyInput(
        draft_token=input_ids,
        custom_mask=None if on_cpu else chain_mask(seq_lens, seq_lens_cpu, width),
        positions=positions,
        draft_token_num=width,
        new_seq_lens=seq_lens,
    )


class SSDVerifyInput(NgramVerifyInput):
    """SGLang's NGRAM verify input with a chain topology: [root, d_1 .. d_γ] per request.

    `tree_topk == 1` tells attention backends the draft tokens form a chain, so plain causal
    masking within the verify window is exact; backends that read a custom mask instead get
    `chain_mask` (module docstring).
    """

    @property
    def tree_topk(self) -> int:
        return 1

    @property
    def max_tree_depth(self) -> int:
        return self.draft_token_num

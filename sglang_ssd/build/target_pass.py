"""One no-grad target forward giving both what an EAGLE-3 head reads and what it must predict."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang_ssd.eagle3.features import capture_layers


@torch.no_grad()
def target_pass(
    target: torch.nn.Module, input_ids: torch.Tensor, aux_layer_ids: Sequence[int] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, logits) of a transformers causal LM over `input_ids`, in one forward.

    Args:
        target: a transformers `*ForCausalLM`.
        input_ids: int64 [B, T].
        aux_layer_ids: the head's `eagle_aux_hidden_state_layer_ids` (None: SGLang's default).

    Returns:
        features [B, T, n × hidden] (the inputs of the `capture_layers` decoder layers,
        low to high, as `features.target_features` gives) and logits [B, T, V], in the target's
        dtype.

    Raises:
        ValueError: as `features.capture_layers`.
    """
    layers = capture_layers(target.config.num_hidden_layers, aux_layer_ids)
    out = target(input_ids=input_ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1), out.logits

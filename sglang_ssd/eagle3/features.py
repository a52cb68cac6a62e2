"""Which target layers feed an EAGLE-3 head, and those target features from a transformers model.

SGLang 0.5.23 (`models/qwen2.py`, `models/llama.py`: `set_eagle3_layers_to_capture`) captures
the *input* of the decoder layers in `layers_to_capture`, i.e. the residual stream before
layer i, which is transformers' `output_hidden_states` index i (index 0 is the embeddings).
Without ids in the head's config the default is [2, L//2, L-3]; explicit
`eagle_config.eagle_aux_hidden_state_layer_ids` k mean layer k+1 (the output of layer k). The
three features (low, mid, high) are concatenated in that order: EAGLE-3's fused features (Li et
al. 2025, §3).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def capture_layers(num_layers: int, aux_layer_ids: Sequence[int] | None) -> list[int]:
    """SGLang's `layers_to_capture`: decoder layers whose input is a feature, in feature order.

    These equal transformers' `output_hidden_states` indices of the same features.

    Args:
        num_layers: the target's decoder layers L.
        aux_layer_ids: the head's `eagle_aux_hidden_state_layer_ids`, or None for the default.

    Raises:
        ValueError: when a layer is outside 0..L-1 (SGLang would capture nothing for it, and
            transformers' index L is the *normed* last output, not a layer input).
    """
    layers = (
        [2, num_layers // 2, num_layers - 3]
        if aux_layer_ids is None
        else [int(k) + 1 for k in aux_layer_ids]
    )
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f"eagle_aux_hidden_state_layer_ids {aux_layer_ids!r} capture the inputs of layers "
            f"{layers}, outside 0..{num_layers - 1} for a target of {num_layers} layers"
        )
    return layers


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """The explicit ids equal to SGLang's default capture: [1, L//2 - 1, L - 4].

    For Qwen2.5-Coder-1.5B (28 layers): [1, 13, 24]. Write these into every head's config.

    Raises:
        ValueError: for a target too shallow for the default (fewer than 4 layers).
    """
    if num_layers < 4:
        raise ValueError(f"SGLang's default EAGLE-3 layers need >= 4 target layers: {num_layers}")
    return [i - 1 for i in capture_layers(num_layers, None)]


@torch.no_grad()
def target_features(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    aux_layer_ids: Sequence[int] | None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The target features an EAGLE-3 head reads, from a transformers causal LM.

    Args:
        target: a transformers `*ForCausalLM` (or its base `*Model`); only the decoder stack
            runs, not the LM head.
        input_ids: int64 [B, T] (or [T]).
        aux_layer_ids: the head's `eagle_aux_hidden_state_layer_ids` (None: SGLang's default).
        attention_mask: optional [B, T] padding mask passed to the target.

    Returns:
        [B, T, n × hidden] (or [T, n × hidden] for 1-D ids) in the target's dtype: the inputs of
        the `capture_layers` decoder layers concatenated along the last dim, low to high.

    Raises:
        ValueError: as `capture_layers`.
    """
    base = getattr(target, "model", target)
    layers = capture_layers(base.config.num_hidden_layers, aux_layer_ids)
    flat = input_ids.dim() == 1
    ids = input_ids[None] if flat else input_ids
    out = base(input_ids=ids, attention_mask=attention_mask, output_hidden_states=True)
    features = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
    return features[0] if flat else features

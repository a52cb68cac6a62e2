"""Which target layers feed an EAGLE-3 head, checked against SGLang's own capture.

The features `target_features` computes with transformers equal the aux hidden states SGLang's
`Qwen2ForCausalLM` captures after `set_eagle3_layers_to_capture` (its real `model.forward` on
the CPU, torch_native attention, see `sglang_cpu`) for the same tokens, on a random tiny Qwen2
target of 8 layers (the trained tiny pair's target has 2 layers, too shallow for SGLang's
default layers [2, L//2, L-3]).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_ssd.eagle3 import capture_layers, default_aux_layer_ids, target_features


def test_default_layers_of_the_real_target_are_explicit_ids_1_13_24() -> None:
    assert capture_layers(28, None) == [2, 14, 25]
    assert default_aux_layer_ids(28) == [1, 13, 24]
    assert capture_layers(28, [1, 13, 24]) == capture_layers(28, None)


@pytest.mark.parametrize("ids", [[7], [-2], [1, 3, 27]])
def test_layers_outside_the_target_are_refused(ids: list[int]) -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.7"):
        capture_layers(8, ids)


def test_default_needs_four_layers() -> None:
    with pytest.raises(ValueError, match=">= 4 target layers"):
        default_aux_layer_ids(3)


def sglang_aux_states(target: Path, ids: torch.Tensor, layer_ids: list[int] | None) -> torch.Tensor:
    """SGLang's captured aux hidden states [T, 3 × hidden] of `ids` [T] through `target`."""
    from safetensors.torch import load_file
    from sglang.srt.models.qwen2 import Qwen2ForCausalLM
    from sglang_cpu import SGLangCPU
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(target)
    model = Qwen2ForCausalLM(config).float()
    model.load_weights(iter(load_file(target / "model.safetensors").items()))
    model.set_eagle3_layers_to_capture(layer_ids)
    head_dim = config.hidden_size // config.num_attention_heads
    sglang = SGLangCPU(config.num_hidden_layers, config.num_key_value_heads, head_dim)
    _, aux = sglang.run(lambda b: model.model(ids, b.positions, b), ids, prefix=0)
    return torch.cat(list(aux), dim=-1)


@pytest.mark.parametrize("layer_ids", [None, [1, 3, 4], [0, 2, 6]], ids=str)
def test_features_equal_sglang_capture(
    sglang_world: None, feature_target: Path, layer_ids: list[int] | None
) -> None:
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 96, (11,), generator=torch.Generator().manual_seed(0))
    target = AutoModelForCausalLM.from_pretrained(feature_target, dtype=torch.float32)
    ours = target_features(target, ids, layer_ids)
    assert ours.shape == (11, 3 * target.config.hidden_size)
    theirs = sglang_aux_states(feature_target, ids, layer_ids)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    batched = target_features(target, ids[None].expand(2, -1), layer_ids)
    torch.testing.assert_close(batched[1], ours, atol=1e-5, rtol=0)

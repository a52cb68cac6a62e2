"""EAGLE-3 head configs: each variant SGLang's llama_eagle3.py reads is supported or refused."""

from __future__ import annotations

import pytest

from sglang_ssd.eagle3 import Eagle3Config
from sglang_ssd.testing.eagle3_heads import head_config

IDS = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}

REFUSED = {
    "architectures": {"architectures": ["LlamaForCausalLM"]},
    "num_hidden_layers": {"num_hidden_layers": 2},
    "tie_word_embeddings": {"tie_word_embeddings": True},
    "hidden_act": {"hidden_act": "gelu"},
    "attention_bias": {"attention_bias": True},
    "bias": {"bias": True},
    "mlp_bias": {"mlp_bias": True},
    "rope_is_neox_style": {"rope_is_neox_style": False},
    "partial_rotary_factor": {"partial_rotary_factor": 0.5},
    "model_type": {"model_type": "llama4_text"},
    "quantization_config": {"quantization_config": {"quant_method": "fp8"}},
    "rope_scaling": {"rope_scaling": {"rope_type": "default", "mrope_section": [8, 8]}},
    "eagle_config.use_aux_hidden_state": {"eagle_config": {**IDS, "use_aux_hidden_state": False}},
    "eagle_aux_hidden_state_layer_ids": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
    "num_aux_hidden_states": {"num_aux_hidden_states": 2},
    "draft_vocab_size": {"draft_vocab_size": 129},
    "equals hidden_size": {
        "target_hidden_size": 32,
        "num_aux_hidden_states": 2,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]},
    },
    "needs target_hidden_size == hidden_size": {"target_hidden_size": 48, "draft_vocab_size": None},
}


@pytest.mark.parametrize("key", list(REFUSED))
def test_unsupported_variant_is_refused_by_name(key: str) -> None:
    with pytest.raises(ValueError, match=key.split(" ")[0].replace(".", r"\.")):
        Eagle3Config.from_dict(head_config(**REFUSED[key]))


def test_missing_draft_vocab_size_is_refused() -> None:
    raw = head_config()
    del raw["draft_vocab_size"]
    with pytest.raises(ValueError, match="draft_vocab_size: missing"):
        Eagle3Config.from_dict(raw)


def test_default_layers_need_three_features() -> None:
    with pytest.raises(ValueError, match="num_aux_hidden_states: 2 without"):
        Eagle3Config.from_dict(head_config(eagle_config={}, num_aux_hidden_states=2))


@pytest.mark.parametrize(
    ("overrides", "field", "value"),
    [
        ({"fc_norm": True}, "fc_norm", True),
        ({"use_aux_norm": True}, "fc_norm", True),
        ({"norm_before_fc": True}, "norm_before_fc", True),
        ({"eagle_config": {**IDS, "norm_before_fc": True}}, "norm_before_fc", True),
        ({"norm_output": True}, "norm_output", True),
        ({"target_hidden_size": 48}, "feature_size", 144),
        ({"eagle_config": {}}, "aux_layer_ids", None),
        ({"draft_vocab_size": None}, "lm_head_rows", 128),
        ({"head_dim": 32}, "head_dim", 32),
        ({"rope_theta": 1e6}, "rope_parameters", {"rope_theta": 1e6, "rope_type": "default"}),
    ],
)
def test_supported_variant(overrides: dict, field: str, value: object) -> None:
    assert getattr(Eagle3Config.from_dict(head_config(**overrides)), field) == value


def test_written_config_reads_back_with_explicit_ids() -> None:
    config = Eagle3Config.from_dict(head_config(fc_norm=True, norm_output=True))
    raw = config.to_dict()
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert Eagle3Config.from_dict(raw) == config


def test_a_written_head_must_name_its_layers() -> None:
    with pytest.raises(ValueError, match="aux_layer_ids"):
        Eagle3Config.from_dict(head_config(eagle_config={})).to_dict()

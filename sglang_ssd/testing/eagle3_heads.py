"""Tiny EAGLE-3 head configs and random heads for the tests (the tiny models' sizes)."""

from __future__ import annotations

import torch

from sglang_ssd.eagle3 import Eagle3Config, Eagle3Head

HIDDEN, HEADS, KV_HEADS, VOCAB = 64, 4, 2, 128  # `TinySpec`'s defaults: the tiny targets' sizes


def head_config(**overrides: object) -> dict:
    """A tiny head's config.json dict, the tiny models' sizes, with `overrides` applied."""
    raw = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 1024,
        "vocab_size": VOCAB,
        "draft_vocab_size": 100,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
    }
    raw.update(overrides)
    return raw


def random_head(raw: dict, seed: int = 0) -> Eagle3Head:
    """A head of config `raw` with random weights (norm weights near 1), d2t a random map onto
    distinct target ids."""
    generator = torch.Generator().manual_seed(seed)
    head = Eagle3Head(Eagle3Config.from_dict(raw))
    with torch.no_grad():
        for param in head.parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1 + 0.1 * noise if param.dim() == 1 else 0.3 * noise)
        if head.lm_head is not None:
            spare = head.config.vocab_size - head.config.lm_head_rows
            offsets = torch.randint(0, spare + 1, head.d2t.shape, generator=generator)
            head.d2t.copy_(offsets.sort().values)  # ascending: distinct target ids i + d2t[i]
    return head

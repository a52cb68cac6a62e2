"""EAGLE-3 draft heads in SGLang 0.5.23's format (`LlamaForCausalLMEagle3`), without SGLang.

- `config`: the head's config.json, each variant SGLang reads supported or refused by name.
- `head`: the head's math (`Eagle3Head`), a batched forward over an explicit KV cache.
- `load`: strict loading and saving of head folders (`load_head`, `save_head`).
- `features`: which target layers feed the head and those features from a transformers target.

Imports torch, transformers and safetensors only (no SGLang), so the speculator, the trainer
(`sglang_ssd.build`, offline) and the GPU machine can use it.
"""

from sglang_ssd.eagle3.config import ARCHITECTURE, Eagle3Config, is_eagle3_head
from sglang_ssd.eagle3.features import capture_layers, default_aux_layer_ids, target_features
from sglang_ssd.eagle3.head import Eagle3Head, HeadOutput, KVCache, causal_mask
from sglang_ssd.eagle3.load import assign_strict, load_head, read_tensors, save_head

__all__ = [
    "ARCHITECTURE",
    "Eagle3Config",
    "Eagle3Head",
    "HeadOutput",
    "KVCache",
    "assign_strict",
    "capture_layers",
    "causal_mask",
    "default_aux_layer_ids",
    "is_eagle3_head",
    "load_head",
    "read_tensors",
    "save_head",
    "target_features",
]

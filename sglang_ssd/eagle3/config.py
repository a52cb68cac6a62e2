"""An EAGLE-3 head's config.json, read exactly as SGLang 0.5.23 reads it, or refused by name.

Source: SGLang's `python/sglang/srt/models/llama_eagle3.py` (`LlamaForCausalLMEagle3`, its
`LlamaModel` and `LlamaDecoderLayer`), `speculative/eagle_utils.py` (the feature width) and
`model_executor/model_runner_components/spec_aux_hidden_state.py` (which target layers feed
the head); the head itself is EAGLE-3's (Li et al. 2025, "EAGLE-3: Scaling up Inference
Acceleration of Large Language Models via Training-Time Test").

Every key SGLang's file reads is either mapped onto `Eagle3Config` or, where our head would
compute something else than SGLang's class, refused with a `ValueError` that names the key.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import LlamaConfig

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class Eagle3Config:
    """Shape and options of an EAGLE-3 head (one Llama decoder layer over target features).

    Attributes:
        hidden_size: the head's width H.
        num_attention_heads / num_key_value_heads / head_dim: the attention's heads.
        intermediate_size: the SiLU MLP's width.
        rms_norm_eps: every RMSNorm's epsilon.
        rope_parameters: transformers' normalised RoPE dict (`rope_type`, `rope_theta`, scaling).
        max_position_embeddings: RoPE's table size.
        vocab_size: the target's vocabulary V.
        draft_vocab_size: rows of the head's own `lm_head` with a `d2t` map to target ids; None
            means the full vocabulary with the target's LM head (SGLang's
            `load_lm_head_from_target`).
        target_hidden_size: width of one target feature (SGLang: `target_hidden_size`, else H).
            When it equals H the head embeds with the target's `embed_tokens`; otherwise SGLang
            keeps the head's own (`own_embeddings`).
        aux_layer_ids: `eagle_config.eagle_aux_hidden_state_layer_ids`, the target layers k whose
            *output* (the input of decoder layer k+1) feeds the head; None means SGLang's default
            layers (see `sglang_ssd.eagle3.features`).
        num_aux_hidden_states: how many target features are concatenated (3 by default).
        fc_norm: an RMSNorm per feature chunk before `fc` (`fc_norm`, legacy `use_aux_norm`).
        norm_before_fc: one RMSNorm over the concatenated features before `fc`.
        norm_output: the hidden fed back to the next draft step is the normed one (else the
            pre-norm one, SGLang's default).
        torch_dtype: the dtype named in the file (informational).
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_parameters: Mapping[str, Any]
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int | None
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] | None = None
    num_aux_hidden_states: int = 3
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_output: bool = False
    torch_dtype: str = "float32"

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features, `fc`'s input (num_aux × target_hidden)."""
        return self.num_aux_hidden_states * self.target_hidden_size

    @property
    def own_embeddings(self) -> bool:
        """Whether the head embeds with its own `embed_tokens` (SGLang's `set_embed` shares the
        target's only when target_hidden_size equals hidden_size)."""
        return self.target_hidden_size != self.hidden_size

    @property
    def lm_head_rows(self) -> int:
        """Rows of the logits the head produces: draft_vocab_size, or V with the target's head."""
        return self.vocab_size if self.draft_vocab_size is None else self.draft_vocab_size

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Eagle3Config:
        """Parse a config.json dict of a `LlamaForCausalLMEagle3` head.

        Raises:
            ValueError: naming the key, for a config that is not such a head, one SGLang would
                read differently from this head (see `_refuse_unsupported`), or inconsistent
                sizes.
        """
        if ARCHITECTURE not in (raw.get("architectures") or []):
            raise ValueError(f"architectures: {raw.get('architectures')!r} lacks {ARCHITECTURE}")
        _refuse_unsupported(raw)
        llama = LlamaConfig.from_dict(dict(raw))  # normalises rope_theta / rope_scaling
        eagle = dict(raw.get("eagle_config") or {})
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        ids = tuple(int(i) for i in ids) if ids else None
        num_aux = raw.get("num_aux_hidden_states")
        num_aux = int(num_aux) if num_aux is not None else (len(ids) if ids else 3)
        if ids is not None and num_aux != len(ids):
            raise ValueError(
                f"num_aux_hidden_states: {num_aux} but eagle_config."
                f"eagle_aux_hidden_state_layer_ids has {len(ids)} ids"
            )
        if ids is None and num_aux != 3:
            raise ValueError(
                f"num_aux_hidden_states: {num_aux} without eagle_aux_hidden_state_layer_ids, "
                "but SGLang's default capture is 3 layers"
            )
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        config = cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=int(raw["intermediate_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_parameters=dict(llama.rope_parameters or {}),
            max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
            vocab_size=int(raw["vocab_size"]),
            draft_vocab_size=_draft_vocab_size(raw),
            target_hidden_size=int(raw.get("target_hidden_size") or hidden),
            aux_layer_ids=ids,
            num_aux_hidden_states=num_aux,
            fc_norm=bool(raw.get("fc_norm") or raw.get("use_aux_norm", False)),
            norm_before_fc=bool(eagle.get("norm_before_fc", raw.get("norm_before_fc", False))),
            norm_output=bool(raw.get("norm_output", False)),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        )
        if config.own_embeddings and config.draft_vocab_size is None:
            raise ValueError(
                "draft_vocab_size: null (the target's LM head) needs target_hidden_size == "
                f"hidden_size, got {config.target_hidden_size} != {config.hidden_size}"
            )
        if config.feature_size == config.hidden_size:
            # SGLang applies fc only when the input is wider than the embeddings, so target
            # features of width H would bypass fc there.
            raise ValueError(
                f"num_aux_hidden_states × target_hidden_size = {config.feature_size} equals "
                "hidden_size: SGLang tells target features from the head's own hidden by width"
            )
        return config

    @classmethod
    def from_folder(cls, folder: str | Path) -> Eagle3Config:
        """Read `folder`/config.json (see `from_dict`).

        Raises:
            FileNotFoundError: without a config.json.
            ValueError: as `from_dict`.
        """
        return cls.from_dict(json.loads((Path(folder) / CONFIG_FILE).read_text()))

    def to_dict(self) -> dict[str, Any]:
        """The config.json SGLang loads this head from, the aux layer ids written explicitly.

        Raises:
            ValueError: if `aux_layer_ids` is None (every head we write names its layers).
        """
        if self.aux_layer_ids is None:
            raise ValueError("aux_layer_ids: a head we write must name its target layers")
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": dict(self.rope_parameters),
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "num_aux_hidden_states": self.num_aux_hidden_states,
            "tie_word_embeddings": False,
            "torch_dtype": self.torch_dtype,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                "use_aux_hidden_state": True,
            },
        }
        for flag in ("fc_norm", "norm_before_fc", "norm_output"):
            if getattr(self, flag):
                out[flag] = True
        return out

    def to_llama_config(self) -> LlamaConfig:
        """A transformers `LlamaConfig` of the head's decoder layer (for its RoPE and MLP)."""
        return LlamaConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            hidden_act="silu",
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=dict(self.rope_parameters),
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=self.vocab_size,
        )


def is_eagle3_head(folder: str | Path) -> bool:
    """Whether `folder` holds a config.json naming `LlamaForCausalLMEagle3` (nothing else read)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return False
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and ARCHITECTURE in (raw.get("architectures") or [])


@functools.cache
def head_feature_layers(draft_model_path: str | None) -> tuple[bool, list[int] | None]:
    """Whether `draft_model_path` is an EAGLE-3 head folder, and the target layers k whose
    output feeds it (`eagle_config.eagle_aux_hidden_state_layer_ids`; None: SGLang's default
    layers, which `set_eagle3_layers_to_capture(None)` picks the same way). A hub name or a
    causal LM folder gives (False, None).

    Raises:
        ValueError: a head config that `Eagle3Config` refuses (a variant it does not support).
    """
    if not draft_model_path or not is_eagle3_head(draft_model_path):
        return False, None
    ids = Eagle3Config.from_folder(draft_model_path).aux_layer_ids
    return True, None if ids is None else list(ids)


def _draft_vocab_size(raw: Mapping[str, Any]) -> int | None:
    if "draft_vocab_size" not in raw:
        # SGLang's class reads `config.draft_vocab_size` unconditionally (AttributeError there).
        raise ValueError("draft_vocab_size: missing (write null for the target's full vocabulary)")
    size = raw["draft_vocab_size"]
    if size is None:
        return None
    if not 0 < int(size) <= int(raw["vocab_size"]):
        raise ValueError(f"draft_vocab_size: {size} is not in 1..vocab_size={raw['vocab_size']}")
    return int(size)


# key -> (the value SGLang's head needs, why another value is refused)
_REQUIRED: dict[str, tuple[Any, str]] = {
    "num_hidden_layers": (1, "SGLang's later layers reuse hidden_norm and skip input_layernorm"),
    "tie_word_embeddings": (False, "SGLang would use the head's own embed_tokens as lm_head"),
    "hidden_act": ("silu", "SGLang's LlamaMLP supports silu only"),
    "attention_bias": (False, "SGLang drops the qkv bias of the first layer"),
    "bias": (False, "SGLang adds it to fc and o_proj but not to qkv_proj"),
    "mlp_bias": (False, "SGLang's LlamaMLP has no bias"),
    "rope_is_neox_style": (True, "only neox-style RoPE"),
    "partial_rotary_factor": (1, "only full-width RoPE"),
    "pretraining_tp": (1, "only pretraining_tp 1"),
}


def _refuse_unsupported(raw: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first key SGLang's class would read differently from ours."""
    for key, (wanted, why) in _REQUIRED.items():
        if key in raw and raw[key] is not None and raw[key] != wanted:
            raise ValueError(f"{key}: {raw[key]!r} is not supported ({why})")
    if raw.get("model_type") == "llama4_text":
        raise ValueError("model_type: llama4_text is not supported (intermediate_size_mlp)")
    if raw.get("quantization_config"):
        raise ValueError("quantization_config: quantised heads are not supported")
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(raw.get(key), Mapping) and "mrope_section" in raw[key]:
            raise ValueError(f"{key}: mrope_section (multimodal RoPE) is not supported")
    eagle = raw.get("eagle_config") or {}
    if not isinstance(eagle, Mapping):
        raise ValueError(f"eagle_config: {eagle!r} is not a JSON object")
    if eagle.get("use_aux_hidden_state", True) is False:
        raise ValueError(
            "eagle_config.use_aux_hidden_state: false (a head fed the target's last hidden "
            "state only) is not supported"
        )
    top_ids = raw.get("eagle_aux_hidden_state_layer_ids")
    if top_ids is not None and _as_list(top_ids) != _as_list(
        eagle.get("eagle_aux_hidden_state_layer_ids")
    ):
        raise ValueError(
            "eagle_aux_hidden_state_layer_ids: at the top level SGLang uses it only for the "
            "feature width and captures eagle_config's ids (or the default layers); put it "
            "under eagle_config"
        )


def _as_list(ids: Sequence[int] | None) -> list[int] | None:
    return None if ids is None else [int(i) for i in ids]

"""Tiny random-weight Qwen2 models with a character-level tokenizer, written as HF folders.

Unit and server tests use them instead of the real pair: SGLang and transformers load them like
any Qwen2 checkpoint, in seconds. Two models built from the same `TinySpec` but different seeds
(or depths) share the tokenizer, so one can serve as the other's draft. `sharpness` scales the
output embeddings to make the next-token distributions low-entropy (distribution tests need
that to resolve small biases with few samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

# Printable ASCII, one token each, then the end-of-text token.
_CHARS = [chr(i) for i in range(32, 127)]
EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny Qwen2 model.

    Attributes:
        num_layers: decoder layers.
        hidden_size / intermediate_size / num_heads / num_kv_heads: the usual sizes.
        vocab_size: ≥ 96 (95 printable characters + end-of-text); extra ids are unused.
        seed: initialises the weights.
        sharpness: multiplies the (tied) embedding matrix; larger means peakier logits.
        dtype: weight dtype written to disk.
    """

    num_layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 128
    seed: int = 0
    sharpness: float = 1.0
    dtype: torch.dtype = torch.float32
    max_position_embeddings: int = 1024


def tokenize(text: str) -> list[int]:
    """Token ids of `text` under the tiny tokenizer (one id per character).

    Raises:
        ValueError: on a character outside printable ASCII.
    """
    index = {c: i for i, c in enumerate(_CHARS)}
    try:
        return [index[c] for c in text]
    except KeyError as exc:
        raise ValueError(f"character {exc.args[0]!r} is not in the tiny vocabulary") from None


def _write_tokenizer(path: Path) -> int:
    """Save a character-level fast tokenizer; returns the EOS id."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(_CHARS)}
    eos_id = len(vocab)
    vocab[EOS_TOKEN] = eos_id
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=EOS_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, unk_token=EOS_TOKEN
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(path)
    return eos_id


def make_tiny_model(path: str | Path, spec: TinySpec = TinySpec()) -> Path:
    """Write a tiny random Qwen2 causal LM + tokenizer to `path` (created); returns the path.

    Raises:
        ValueError: if `spec.vocab_size` cannot hold the 96 tokenizer tokens.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    if spec.vocab_size < len(_CHARS) + 1:
        raise ValueError(f"vocab_size must be >= {len(_CHARS) + 1}, got {spec.vocab_size}")
    path.mkdir(parents=True, exist_ok=True)
    eos_id = _write_tokenizer(path)
    config = Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        layer_types=["full_attention"] * spec.num_layers,
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(spec.sharpness)
    model.to(spec.dtype).save_pretrained(path)
    return path

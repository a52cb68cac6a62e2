"""Convert a GGUF file to a bf16 safetensors Hugging Face folder, and check the result.

transformers' GGUF loader reads the config, tokenizer (with chat template) and weights;
`GgufConfig(dequantize=True)` unpacks every weight into a dense bf16 model, which, unlike the packed
default, can be saved. Dequantising the 1.5B model needs about 7 GB of RAM.

Quirks handled here (each differs from upstream's Hugging Face folder without this code):
- The Qwen GGUFs store `output.weight` (Q8_0) apart from `token_embd.weight` (Q5_0/Q6_K), so the
  converted config has `tie_word_embeddings: false` with two close but different matrices. That is
  the faithful reading of the file and is kept; `check_converted` verifies `lm_head` is a real copy.
- The GGUF tokenizer comes back without Qwen2's NFC normaliser; it is restored.
- generation_config gets upstream's stop ids (<|im_end|> and <|endoftext|>) but none of upstream's
  sampling defaults (temperature 0.7, top_p, top_k, repetition_penalty): SGLang applies a model's
  generation_config as request defaults, and a silent repetition penalty would change p.
"""

from __future__ import annotations

import gc
import hashlib
import json
from pathlib import Path

from .registry import ModelSpec

# lm_head and embed_tokens are quantised separately from one matrix; a few % apart is expected,
# an unrelated (e.g. randomly initialised) matrix is ~140% apart.
MAX_UNTIED_RELATIVE_DIFF = 0.15
CHAT_TEMPLATE_MARKER = "<|im_start|>"
END_OF_TURN = "<|im_end|>"


class ConversionError(RuntimeError):
    """The converted folder does not have the config, weights or tokenizer it must have."""


def convert_gguf(gguf_path: Path, out_dir: Path, spec: ModelSpec) -> None:
    """Write a bf16 safetensors Hugging Face folder for `gguf_path` into `out_dir`.

    Args:
        gguf_path: the checked GGUF file.
        out_dir: folder to create (must not exist); gets config.json, generation_config.json,
            model safetensors, tokenizer.json, tokenizer_config.json, chat_template.jinja.
        spec: the model, for its stop ids.

    Raises:
        ConversionError: transformers returned a model that is still quantised.
    """
    import torch
    from tokenizers import normalizers
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        from transformers import GgufConfig
    except ImportError:  # transformers < 5 always dequantises GGUF weights
        GgufConfig = None

    source, name = str(gguf_path.parent), gguf_path.name
    steps = ["tokenizer", "weights", "save"]
    with tqdm(total=len(steps), desc=f"convert {spec.name}", unit="step") as bar:
        bar.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
        backend = tokenizer.backend_tokenizer
        if spec.architecture == "Qwen2ForCausalLM" and backend.normalizer is None:
            backend.normalizer = normalizers.NFC()
        bar.update(1)

        bar.set_postfix_str("dequantise weights")
        extra = {"quantization_config": GgufConfig(dequantize=True)} if GgufConfig else {}
        model = AutoModelForCausalLM.from_pretrained(
            source, gguf_file=name, dtype=torch.bfloat16, **extra
        )
        if getattr(model, "is_quantized", False):
            raise ConversionError(f"{gguf_path.name}: transformers kept the weights quantised")
        model.generation_config = GenerationConfig(
            bos_token_id=model.config.bos_token_id,
            eos_token_id=list(spec.eos_token_ids),
            pad_token_id=model.config.pad_token_id,
        )
        bar.update(1)

        bar.set_postfix_str("save")
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        _match_permissions(out_dir, reference=out_dir / "config.json")
        bar.update(1)
    del model, tokenizer
    gc.collect()


def _match_permissions(folder: Path, reference: Path) -> None:
    """Give every file in `folder` the mode of `reference` (one written with the user's umask).

    transformers writes safetensors through a private temp file (mode 0600); a shared cache
    should be as readable as the rest of the folder.
    """
    mode = reference.stat().st_mode & 0o777
    for file in folder.iterdir():
        if file.is_file():
            file.chmod(mode)


def _check_config(config: dict, spec: ModelSpec) -> None:
    dtype = config.get("dtype") or config.get("torch_dtype")
    problems = []
    if dtype != "bfloat16":
        problems.append(f"dtype is {dtype!r}, expected 'bfloat16'")
    if config.get("architectures") != [spec.architecture]:
        found = config.get("architectures")
        problems.append(f"architectures {found}, expected [{spec.architecture!r}]")
    if config.get("vocab_size") != spec.vocab_size:
        problems.append(f"vocab_size {config.get('vocab_size')}, expected {spec.vocab_size}")
    if "quantization_config" in config:
        problems.append("config still has a quantization_config")
    if problems:
        raise ConversionError("config.json: " + "; ".join(problems))


def _check_weights(folder: Path, tied: bool) -> None:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{folder}: no safetensors files")
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(file, "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if (dtype := handle.get_slice(key).get_dtype()) != "BF16":
                    raise ConversionError(f"{file.name}: {key} is {dtype}, expected BF16")
                where[key] = file
    embed, head = "model.embed_tokens.weight", "lm_head.weight"
    if embed not in where:
        raise ConversionError(f"{folder}: no {embed}")
    if tied:
        return  # SGLang and transformers reuse embed_tokens; a stored lm_head would be ignored
    if head not in where:
        raise ConversionError(f"{folder}: tie_word_embeddings is false but there is no {head}")
    with safe_open(where[embed], "pt") as a, safe_open(where[head], "pt") as b:
        e, h = a.get_tensor(embed).float(), b.get_tensor(head).float()
    if e.shape != h.shape:
        raise ConversionError(f"{head} shape {tuple(h.shape)} != {embed} {tuple(e.shape)}")
    diff = ((e - h).norm() / e.norm()).item()
    if diff > MAX_UNTIED_RELATIVE_DIFF:
        raise ConversionError(f"{head} is {diff:.0%} away from {embed}: not a copy of it")


def _check_tokenizer(folder: Path, spec: ModelSpec) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    template = tokenizer.chat_template or ""
    problems = []
    if CHAT_TEMPLATE_MARKER not in template:
        problems.append("no Qwen chat template")
    if tokenizer.eos_token != END_OF_TURN:
        problems.append(f"eos_token {tokenizer.eos_token!r}, expected {END_OF_TURN!r}")
    if tokenizer.convert_tokens_to_ids(END_OF_TURN) != spec.eos_token_ids[0]:
        problems.append(f"{END_OF_TURN} is not token {spec.eos_token_ids[0]}")
    if len(tokenizer) > spec.vocab_size:
        problems.append(f"{len(tokenizer)} tokens, more than the {spec.vocab_size} embeddings")
    if problems:
        raise ConversionError(f"{folder} tokenizer: " + "; ".join(problems))


def check_converted(folder: Path, spec: ModelSpec) -> None:
    """Check a converted folder without loading the model.

    Checks: config (bf16, architecture, vocab size, no quantization_config), every stored tensor
    bf16, `lm_head` present and close to `embed_tokens` when untied, tokenizer with the Qwen chat
    template and <|im_end|> as eos.

    Raises:
        ConversionError: naming the first failing check.
    """
    config = json.loads((folder / "config.json").read_text())
    _check_config(config, spec)
    _check_weights(folder, tied=bool(config.get("tie_word_embeddings")))
    _check_tokenizer(folder, spec)


def tokenizer_fingerprint(folder: Path) -> str:
    """sha256 of what decides tokenization: tokenizer.json's model, normaliser, pre-tokeniser and
    added tokens. Two folders with the same fingerprint tokenize identically."""
    data = json.loads((folder / "tokenizer.json").read_text())
    keys = ("model", "normalizer", "pre_tokenizer", "added_tokens")
    payload = json.dumps({k: data.get(k) for k in keys}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()

"""`--quantization ssd_int8` inside SGLang's own Qwen2 model, in this process (SGLang's CPU
world: `sglang_world`): SGLang's loader hands every linear layer and the LM head to our method,
which swaps their bf16 weights for int8 after loading, caches them beside the checkpoint and
reads them back; logits stay within int8's error; start-up refuses what it cannot run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_ssd.target import METHOD
from sglang_ssd.target.int8_cache import FOLDER
from sglang_ssd.testing.tiny_models import TinySpec, make_tiny_model

LAYERS = 2
PROMPT = [68, 69, 70, 0, 70, 73, 66, 79, 78, 65, 67, 67, 73]


@pytest.fixture
def untied(tmp_path: Path) -> Path:
    """A tiny Qwen2 with its own LM head (the tiny models tie it to the embeddings)."""
    folder = make_tiny_model(tmp_path / "untied", TinySpec(num_layers=LAYERS, sharpness=4.0))
    weights = load_file(folder / "model.safetensors")
    gen = torch.Generator().manual_seed(1)
    embed = weights["model.embed_tokens.weight"]
    weights["lm_head.weight"] = embed + 0.1 * torch.randn(embed.shape, generator=gen)
    save_file(weights, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    return folder


def _sglang_model(folder: Path, quantized: bool) -> torch.nn.Module:
    """SGLang's Qwen2 of `folder`, loaded and post-processed as its `DefaultModelLoader` does."""
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.models.qwen2 import Qwen2ForCausalLM
    from transformers import AutoConfig

    from sglang_ssd.target.int8_method import Int8Config

    quant = None
    if quantized:
        quant = Int8Config()
        quant.model_path = str(folder)  # what the wrapped `_get_quantization_config` sets
    model = Qwen2ForCausalLM(AutoConfig.from_pretrained(folder), quant_config=quant)
    model.load_weights(iter(load_file(folder / "model.safetensors").items()))
    DefaultModelLoader.postprocess_weights(model, torch.device("cpu"))
    return model


def _last_logits(model: torch.nn.Module) -> torch.Tensor:
    from sglang_cpu import SGLangCPU

    config = model.config
    sglang = SGLangCPU(
        LAYERS, config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    )
    ids = torch.tensor(PROMPT)
    out = sglang.run(lambda b: model(ids, b.positions, b), ids, prefix=0)
    return out.next_token_logits[-1]


def _codes(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every int8 layer's codes and row scales, unpacked from FBGEMM's packed weights."""
    out = []
    for module in model.modules():
        if hasattr(module, "int8_weight"):
            weight, _ = torch.ops.quantized.linear_unpack(module.int8_weight)
            out += [weight.int_repr(), weight.q_per_channel_scales()]
    return out


def test_linear_layers_and_lm_head_run_in_int8_within_its_error(sglang_world, untied):
    from sglang.srt.layers.linear import LinearBase

    int8 = _sglang_model(untied, quantized=True)
    linears = [m for m in int8.modules() if isinstance(m, LinearBase)] + [int8.lm_head]
    assert len(linears) == 4 * LAYERS + 1
    for module in linears:
        assert module.weight.dtype == torch.int8 and module.weight.is_meta  # a placeholder
        assert module.int8_weight is not None  # FBGEMM's packed weight
    assert int8.model.embed_tokens.weight.dtype == torch.float32  # embeddings stay
    got, want = _last_logits(int8), _last_logits(_sglang_model(untied, quantized=False))
    assert got.argmax() == want.argmax()
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


def test_the_cache_is_read_back_and_rebuilt_when_the_checkpoint_changes(sglang_world, untied):
    first = _sglang_model(untied, quantized=True)
    (cached,) = (untied / FOLDER).iterdir()
    second = _sglang_model(untied, quantized=True)
    assert second.quant_config.cache_hit and second.quant_config.quantized_layers == 0
    for a, b in zip(_codes(first), _codes(second), strict=True):
        assert torch.equal(a, b)
    weights = untied / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    third = _sglang_model(untied, quantized=True)
    assert not third.quant_config.cache_hit
    assert third.quant_config.quantized_layers == 4 * LAYERS + 1
    (rebuilt,) = (untied / FOLDER).iterdir()
    assert rebuilt != cached


def test_start_up_refuses_without_the_kernel_or_off_the_cpu(sglang_world, monkeypatch):
    import sglang.srt.utils as sglang_utils

    from sglang_ssd.target import int8_method

    monkeypatch.setattr(int8_method, "kernel_unavailable", lambda: "no int8 GEMM here")
    with pytest.raises(ValueError, match=f"--quantization {METHOD}: no int8 GEMM here"):
        int8_method.Int8Config()
    monkeypatch.setattr(sglang_utils, "is_cpu", lambda: False)
    with pytest.raises(ValueError, match="runs on the CPU only"):
        int8_method.Int8Config()


def test_registered_as_an_sglang_method_and_handed_the_checkpoint(sglang_world, monkeypatch):
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
    from sglang.srt.model_loader import loader

    from sglang_ssd.target.int8_method import Int8Config, register

    made = Int8Config()
    monkeypatch.setattr(loader, "_get_quantization_config", lambda model_config, load: made)
    register()
    register()  # idempotent: wrapped once
    assert get_quantization_config(METHOD) is Int8Config and METHOD in QUANTIZATION_METHODS
    assert QUANTIZATION_CHOICES.count(METHOD) == 1
    config = loader._get_quantization_config(SimpleNamespace(model_path="/models/t"), None)
    assert config is made and made.model_path == "/models/t"

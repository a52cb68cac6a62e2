"""Strict loading of EAGLE-3 head folders: every parameter from the file, no tensor unused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_ssd.eagle3 import Eagle3Head, is_eagle3_head, load_head, save_head
from sglang_ssd.testing.eagle3_heads import HIDDEN, VOCAB, head_config, random_head


def saved(tmp_path: Path, **overrides: object) -> tuple[Eagle3Head, Path]:
    head = random_head(head_config(**overrides))
    return head, save_head(tmp_path / "head", head)


def rewrite(folder: Path, edit) -> None:
    """Apply `edit` to the folder's tensor dict and write it back."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    head, folder = saved(tmp_path)
    assert is_eagle3_head(folder)
    loaded = load_head(folder)
    assert loaded.config == head.config
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    embed = torch.randn(VOCAB, HIDDEN)
    for h in (head, loaded):
        h.attach_target(embed)
    ids, feats = torch.randint(0, VOCAB, (1, 5)), torch.randn(1, 5, 3 * HIDDEN)
    pos = torch.arange(5)[None]
    with torch.no_grad():
        assert torch.equal(head(ids, feats, pos).logits, loaded(ids, feats, pos).logits)


def test_sglang_names_load_too(tmp_path: Path) -> None:
    """`layers.0.*`, a `model.` prefix, legacy aux_norm_* names; embed_tokens and t2d ignored."""
    head, folder = saved(tmp_path, fc_norm=True)

    def legacy(t: dict) -> None:
        for name in list(t):
            new = name.replace("midlayer.", "layers.0.").replace("fc_norm.0.", "aux_norm_low.")
            new = new.replace("fc_norm.1.", "aux_norm_mid.").replace("fc_norm.2.", "aux_norm_high.")
            t["model." + new if new.startswith("norm") else new] = t.pop(name)
        t["embed_tokens.weight"] = torch.zeros(VOCAB, HIDDEN)
        t["t2d"] = torch.zeros(VOCAB, dtype=torch.bool)

    rewrite(folder, legacy)
    loaded = load_head(folder)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    _, folder = saved(tmp_path)
    rewrite(folder, lambda t: t.pop("midlayer.hidden_norm.weight"))
    with pytest.raises(ValueError, match=r"missing: midlayer\.hidden_norm\.weight"):
        load_head(folder)


def test_unused_tensor_is_named(tmp_path: Path) -> None:
    _, folder = saved(tmp_path)
    rewrite(folder, lambda t: t.update({"midlayer.self_attn.q_norm.weight": torch.ones(16)}))
    with pytest.raises(ValueError, match=r"unused: midlayer\.self_attn\.q_norm\.weight"):
        load_head(folder)


def test_lm_head_of_a_full_vocabulary_head_is_unused(tmp_path: Path) -> None:
    """draft_vocab_size null: SGLang replaces a shipped lm_head by the target's."""
    _, folder = saved(tmp_path, draft_vocab_size=None)
    rewrite(folder, lambda t: t.update({"lm_head.weight": torch.zeros(VOCAB, HIDDEN)}))
    with pytest.raises(ValueError, match=r"unused: lm_head\.weight"):
        load_head(folder)


def test_shape_mismatch_is_named(tmp_path: Path) -> None:
    _, folder = saved(tmp_path)
    rewrite(folder, lambda t: t.update({"fc.weight": torch.zeros(HIDDEN, 2 * HIDDEN)}))
    with pytest.raises(ValueError, match=r"shape: fc\.weight \(64, 128\) != \(64, 192\)"):
        load_head(folder)


def test_pytorch_bin_is_refused(tmp_path: Path) -> None:
    _, folder = saved(tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"pytorch_model\.bin"):
        load_head(folder)


def test_not_a_head(tmp_path: Path) -> None:
    assert not is_eagle3_head(tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    assert not is_eagle3_head(tmp_path)

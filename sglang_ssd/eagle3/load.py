"""Strict loading and saving of EAGLE-3 heads in SGLang 0.5.23's file format.

SGLang's `LlamaForCausalLMEagle3.load_weights` (`models/llama_eagle3.py`) renames `midlayer` to
`layers.0` and `aux_norm_low/mid/high` to `fc_norm.0/1/2`, accepts names with or without a
`model.` prefix, turns `d2t` into its hot-token map, drops `t2d`, and silently skips every name
it does not know, so "SGLang loads it" proves nothing. Here every parameter of `Eagle3Head` must
come from the file and every tensor in the file must be used, except `embed_tokens` (the head
uses the target's, unless target_hidden_size differs from hidden_size) and `t2d` (unused by
SGLang).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from sglang_ssd.eagle3.config import CONFIG_FILE, Eagle3Config
from sglang_ssd.eagle3.head import Eagle3Head

WEIGHTS_FILE = "model.safetensors"
IGNORED = ("embed_tokens.weight", "t2d")
# SGLang's legacy names, read the other way round: our head keeps the `midlayer` name.
_RENAMES = {
    "layers.0.": "midlayer.",
    "aux_norm_low.": "fc_norm.0.",
    "aux_norm_mid.": "fc_norm.1.",
    "aux_norm_high.": "fc_norm.2.",
}


def canonical_name(name: str) -> str:
    """A head file's tensor name as `Eagle3Head` names it (`midlayer.*`, no `model.` prefix)."""
    name = name.removeprefix("model.")
    for old, new in _RENAMES.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def read_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's *.safetensors files, under their file names.

    Raises:
        FileNotFoundError: without safetensors files (a pytorch_model.bin is named).
        ValueError: when two files hold the same name.
    """
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        other = sorted(p.name for p in folder.glob("*.bin"))
        raise FileNotFoundError(f"{folder}: no *.safetensors (found {other or 'nothing'})")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        for name, tensor in load_file(path).items():
            if name in tensors:
                raise ValueError(f"{name}: in more than one file of {folder}")
            tensors[name] = tensor
    return tensors


def assign_strict(head: Eagle3Head, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy `tensors` (file names) into `head`: all of its state, nothing left over.

    Raises:
        ValueError: listing the head's names the file lacks, the file's names the head does
            not use, and shape mismatches.
    """
    state = head.state_dict()
    given: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.removeprefix("model.") in IGNORED and canonical_name(name) not in state:
            continue
        key = canonical_name(name)
        if key in given:
            raise ValueError(f"{name}: a second tensor for {key}")
        given[key] = tensor
    missing = sorted(set(state) - set(given))
    unused = sorted(set(given) - set(state))
    shapes = [
        f"{k} {tuple(given[k].shape)} != {tuple(state[k].shape)}"
        for k in sorted(set(state) & set(given))
        if given[k].shape != state[k].shape
    ]
    problems = [
        f"missing: {', '.join(missing)}" if missing else "",
        f"unused: {', '.join(unused)}" if unused else "",
        f"shape: {'; '.join(shapes)}" if shapes else "",
    ]
    if any(problems):
        raise ValueError("EAGLE-3 head weights: " + " | ".join(p for p in problems if p))
    head.load_state_dict(given, strict=True)


def load_head(
    folder: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Eagle3Head:
    """An `Eagle3Head` from an SGLang-format head folder (config.json + *.safetensors).

    The target's embeddings are not in it: call `head.attach_target(...)` before `forward`.

    Raises:
        ValueError: for an unsupported config (by key, see `Eagle3Config.from_dict`) or weights
            that do not match the head exactly (see `assign_strict`).
        FileNotFoundError: without config.json or safetensors files.
    """
    config = Eagle3Config.from_folder(folder)
    head = Eagle3Head(config)
    assign_strict(head, read_tensors(folder))
    return head.to(device=device, dtype=dtype).eval()


def target_tensors(folder: str | Path, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The tensors `names` of a model folder's safetensors files (e.g. a target's
    ``model.embed_tokens.weight``), read one by one: the rest of a 3 GB target stays on disk.

    Raises:
        FileNotFoundError: without safetensors files.
        KeyError: for a name no file holds.
    """
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no safetensors files")
    out: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, "pt") as handle:
            for name in set(names) & set(handle.keys()):
                out[name] = handle.get_tensor(name)
    missing = sorted(set(names) - set(out))
    if missing:
        raise KeyError(f"{folder}: no tensor {', '.join(missing)}")
    return out


def save_head(folder: str | Path, head: Eagle3Head) -> Path:
    """Write `head` as SGLang loads it: config.json (aux layer ids explicit) + model.safetensors.

    Tensors are stored under SGLang's names (`midlayer.*`, `fc.weight`, `norm.weight`,
    `lm_head.weight`, `d2t`, and `fc_norm.*` / `input_norm.weight` when configured, and
    `embed_tokens.weight` for a head with its own embeddings), in the head's dtype; the
    target's embeddings are not written. Other ``*.safetensors`` files in `folder` are removed
    (`read_tensors` reads them all, so a stale one would break loading).

    Returns:
        `folder` (created).

    Raises:
        ValueError: if the head's config has no explicit `aux_layer_ids`.
    """
    folder = Path(folder)
    config = head.config.to_dict()
    folder.mkdir(parents=True, exist_ok=True)
    dtype = head.fc.weight.dtype
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    for stale in folder.glob("*.safetensors"):
        stale.unlink()
    save_file(state, folder / WEIGHTS_FILE, metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return folder

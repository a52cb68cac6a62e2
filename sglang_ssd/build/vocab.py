"""Counting a reduced draft vocabulary (`speculator.draft_vocab` holds its format and loader).

Which ids: counts over local text outside the evaluation packages (`corpus.vocab_files`, the
exclusion rule `corpus.excluded`): the Python standard library's sources (code, docstrings,
comments) and the text documentation of installed packages, read in sorted path order up to
`CORPUS_BYTES`, so the list is a pure function of the installed files. The tokenizer's special
tokens and the model's EOS ids are always kept. Written to the cache `draft_vocab.cache_path`
names, keyed by `draft_vocab.COUNT_VERSION`: bump it on any change to what is counted here.

CLI, the one entry point (the launcher and the speculator run it in a subprocess on a cache
miss, `draft_vocab.load_or_build`, so that no serving process imports this package):
``python -m sglang_ssd.build.vocab --model PATH [--size N]`` (N: `--ssd-draft-vocab`'s default).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Iterable, Sequence

import torch

from sglang_ssd.build import corpus
from sglang_ssd.config import DEFAULT_DRAFT_VOCAB
from sglang_ssd.speculator import draft_vocab
from sglang_ssd.speculator.draft_vocab import DraftVocab

logger = logging.getLogger(__name__)

CORPUS_BYTES = 24 * 2**20  # ~7M tokens: ranks up to 32k are stable to a few percent


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


def build(
    model_path: str | os.PathLike[str], size: int, vocab_size: int, eos_ids: Sequence[int]
) -> DraftVocab:
    """Count the `size`-id vocabulary of the model at `model_path` over the local corpus (about
    25 s on one core) and cache it (`draft_vocab.save`).

    Raises:
        ValueError: `size` not in 1..`vocab_size`.
        FileNotFoundError: no tokenizer files in `model_path`.
        RuntimeError: the local corpus holds no readable text.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    start = time.perf_counter()
    files = corpus.vocab_files()
    counts = count_ids(tokenizer, corpus.vocab_chunks(files, CORPUS_BYTES), vocab_size)
    if int(counts.sum()) == 0:
        raise RuntimeError(f"no text to count a draft vocabulary from ({len(files)} files)")
    source = (
        f"{int(counts.sum())} tokens of {len(files)} local files (stdlib code, package docs), "
        f"counted in {time.perf_counter() - start:.0f} s"
    )
    vocab = DraftVocab(top_ids(counts, size, special_ids(tokenizer, eos_ids)), vocab_size, source)
    path = draft_vocab.save(vocab, model_path, size)
    logger.info("draft vocabulary: %d ids from %s; cached at %s", vocab.size, source, path)
    return vocab


def main(argv: list[str] | None = None) -> None:
    """CLI: count and cache (or read from the cache) the vocabulary of `--size` ids for
    `--model`, V and the EOS ids from its configs unless given; print its size."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang_ssd.build.vocab",
        description="Count and cache the reduced draft vocabulary that `--ssd-draft-vocab N` "
        "uses: the N most frequent ids of the model's tokenizer on local code and text, plus "
        "its special and EOS ids.",
    )
    parser.add_argument("--model", required=True, help="HF model folder (tokenizer + config)")
    parser.add_argument(
        "--size",
        type=int,
        default=DEFAULT_DRAFT_VOCAB,
        help=f"N, the most frequent ids kept (default {DEFAULT_DRAFT_VOCAB}, as --ssd-draft-vocab)",
    )
    parser.add_argument("--vocab-size", type=int, help="V (default: the config's vocab_size)")
    parser.add_argument("--eos-ids", type=int, nargs="*", help="default: the configs' EOS ids")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO")
    vocab_size, eos_ids = draft_vocab.vocab_size_and_eos(args.model)
    if args.vocab_size is not None:
        vocab_size = args.vocab_size
    if args.eos_ids is not None:
        eos_ids = tuple(args.eos_ids)
    if (
        args.size < vocab_size
        and not draft_vocab.cache_path(args.model, vocab_size, args.size).is_file()
    ):
        build(args.model, args.size, vocab_size, eos_ids)
    vocab = draft_vocab.load_or_build(args.model, args.size, vocab_size, eos_ids)  # the cache
    print(f"{vocab.size} ids: the {args.size} most frequent + special and EOS ids ({vocab.source})")


if __name__ == "__main__":
    main()

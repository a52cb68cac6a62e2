"""Counting a reduced draft vocabulary (`sglang_ssd.build.vocab`): the most frequent ids, ties
to the lower id, special and EOS ids always kept, over a corpus that never holds excluded text."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.build import corpus
from sglang_ssd.build.vocab import top_ids


def test_top_ids_keeps_the_most_frequent_and_the_always_ids_sorted() -> None:
    counts = torch.tensor([5, 0, 9, 5, 1, 0])
    assert top_ids(counts, 3).tolist() == [0, 2, 3]  # 9, then the tie 5/5 both
    assert top_ids(counts, 2).tolist() == [0, 2]  # ties: the lower id first
    assert top_ids(counts, 2, always=[5, 5, 99]).tolist() == [0, 2, 5]  # out of range ignored
    with pytest.raises(ValueError, match=r"1\.\.6"):
        top_ids(counts, 0)


def test_vocab_corpus_is_stdlib_code_then_package_docs_never_excluded() -> None:
    files = corpus.vocab_files()
    code = [f for f in files if f.suffix == ".py"]
    docs = files[len(code) :]
    assert code and docs and files == code + docs  # code first
    assert code == sorted(code) and docs == sorted(docs)
    assert all(f.suffix in corpus.DOC_SUFFIXES for f in docs)
    roots = [corpus.stdlib_root(), *corpus.site_roots()]
    relative = [f.relative_to(next(r for r in roots if f.is_relative_to(r))) for f in files]
    assert not [r for r in relative if corpus.excluded(r)]
    assert not [r for r in relative if r.parts[:2] == ("sglang", "test")]

"""Backup speculators: n-gram (longest suffix first, most recent match) and random."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.saguaro import NgramSpeculator, RandomSpeculator


def test_longest_suffix_wins_over_shorter_more_recent_match() -> None:
    tokens = [7, 1, 8, 2, 1, 9, 7, 1]
    assert NgramSpeculator(max_ngram=3).propose(tokens, 1).tolist() == [8]  # "7 1" -> 8
    assert NgramSpeculator(max_ngram=1).propose(tokens, 1).tolist() == [9]  # "1" -> 9


def test_most_recent_occurrence_and_copy_forward() -> None:
    assert NgramSpeculator().propose([1, 2, 5, 1, 2, 6, 1, 2], 2).tolist() == [6, 1]
    assert NgramSpeculator().propose([1, 2, 3, 4, 1, 2, 3], 3).tolist() == [4, 1, 2]
    # The copy runs into the tokens it has just proposed: periodic text keeps its period.
    assert NgramSpeculator().propose([3, 4, 3, 4], 5).tolist() == [3, 4, 3, 4, 3]
    assert NgramSpeculator().propose([5, 5], 3).tolist() == [5, 5, 5]


def test_deterministic_fill_without_a_match() -> None:
    spec = NgramSpeculator(max_ngram=3, min_ngram=2)
    assert spec.propose([4, 1, 4, 2], 3).tolist() == [2, 2, 2]  # "4" alone is below min_ngram
    assert NgramSpeculator().propose([9], 2).tolist() == [9, 9]
    assert NgramSpeculator().propose([], 2).tolist() == [0, 0]
    assert NgramSpeculator().propose([1, 2], 0).shape == (0,)


def test_tensor_input_and_batch() -> None:
    spec = NgramSpeculator()
    out = spec.propose(torch.tensor([1, 2, 3, 1, 2], dtype=torch.int32), 2)
    assert out.dtype == torch.int64 and out.tolist() == [3, 1]
    batch = spec.propose_batch([[1, 2, 1], torch.tensor([6, 6])], 3)
    assert batch.shape == (2, 3) and batch.tolist() == [[2, 1, 2], [6, 6, 6]]
    with pytest.raises(ValueError):
        spec.propose(torch.zeros(2, 2, dtype=torch.long), 1)
    with pytest.raises(ValueError):
        spec.propose([1], -1)
    with pytest.raises(ValueError):
        NgramSpeculator(max_ngram=2, min_ngram=3)


def test_random_speculator() -> None:
    spec = RandomSpeculator(11, torch.Generator().manual_seed(0))
    out = spec.propose_batch([None] * 2000, 4)
    assert out.shape == (2000, 4) and out.dtype == torch.int64
    assert int(out.min()) == 0 and int(out.max()) == 10
    again = RandomSpeculator(11, torch.Generator().manual_seed(0)).propose_batch([None] * 2000, 4)
    assert torch.equal(out, again)
    assert spec.propose([1, 2, 3], 5).shape == (5,)
    with pytest.raises(ValueError):
        RandomSpeculator(0)

"""The target's verify step on hand-made logits: the forward's input layout, greedy acceptance in
SGLang's chain layout (stride W), rows of different draft depths, and the local n-gram drafts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_ssd.saguaro import SamplingBatch
from sglang_ssd.worker.draft_batch import DraftBatch
from sglang_ssd.worker.draft_provider import LocalNgramProvider
from sglang_ssd.worker.verify_step import verify_batch, verify_tokens

V = 16
W = 4  # γ = 3


def point_mass(tokens: list[list[int]], depth: list[int]) -> DraftBatch:
    b = len(tokens)
    return DraftBatch(
        tokens=torch.tensor(tokens, dtype=torch.int64),
        depth=torch.tensor(depth, dtype=torch.int64),
        q=None,
        has_q=torch.zeros(b, dtype=torch.bool),
        sources=["ngram"] * b,
    )


def greedy(b: int) -> SamplingBatch:
    return SamplingBatch(
        temperature=torch.zeros(b), top_k=torch.ones(b, dtype=torch.int64), top_p=torch.ones(b)
    )


def argmax_logits(rows: list[list[int]]) -> torch.Tensor:
    """float [B * W, V] whose argmax at row b, position j is rows[b][j]."""
    logits = torch.zeros(len(rows) * W, V)
    for i, token in enumerate(t for row in rows for t in row):
        logits[i, token] = 10.0
    return logits


def test_verify_tokens_puts_the_root_first_and_zeroes_padding() -> None:
    drafts = point_mass([[5, 6, -1], [7, -1, -1]], [2, 1])
    assert verify_tokens([1, 2], drafts, W).tolist() == [[1, 5, 6, 0], [2, 7, 0, 0]]


def test_greedy_rows_accept_the_matching_prefix_and_take_the_bonus() -> None:
    # Row 0 drafts 5 6 7 and the target agrees on 5 6, then says 9: k = 2, bonus 9.
    # Row 1 (depth 1) drafts 3 and the target says 4 at once: k = 0, bonus 4.
    drafts = point_mass([[5, 6, 7], [3, -1, -1]], [3, 1])
    logits = argmax_logits([[5, 6, 9, 11], [4, 8, 8, 8]])
    out = verify_batch(logits, drafts, greedy(2), W)
    assert out.accept_len.tolist() == [2, 0]
    assert out.bonus.tolist() == [9, 4]
    assert out.accept_lens_with_bonus.tolist() == [3, 1]
    assert out.predict.tolist() == [5, 6, 9, 0, 4, 0, 0, 0]
    assert out.accept_index.tolist() == [[0, 1, 2, -1], [4, -1, -1, -1]]


def test_verify_batch_refuses_drafts_wider_than_the_window() -> None:
    drafts = point_mass([[1, 2, 3, 4]], [4])
    with pytest.raises(ValueError, match="do not fit"):
        verify_batch(torch.zeros(W, V), drafts, greedy(1), W)


def test_local_ngram_drafts_continue_a_repeated_pattern() -> None:
    req = SimpleNamespace(origin_input_ids=[1, 2, 3, 1, 2], output_ids=[3, 1])
    drafts = LocalNgramProvider(lookahead=3).drafts([req])
    assert drafts.sources == ["local-ngram"] and drafts.depth.tolist() == [3]
    assert drafts.tokens.tolist() == [[2, 3, 1]]
    assert drafts.q is None and not drafts.has_q.any()

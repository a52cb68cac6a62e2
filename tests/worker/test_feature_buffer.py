"""The target's EAGLE-3 features from its forwards to the Step (`worker.feature_buffer`)."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.worker import feature_buffer
from sglang_ssd.worker.feature_buffer import FeatureBuffer, extend_features, verify_features

F = 6


def _rows(first: int, n: int) -> torch.Tensor:
    """Features whose every entry is its position (so a misplaced row shows)."""
    return torch.arange(first, first + n, dtype=torch.float32).unsqueeze(1).repeat(1, F)


def test_runs_merge_in_order_and_take_packs_them_per_rid() -> None:
    buf = FeatureBuffer()
    buf.add("a", 0, _rows(0, 5))  # a prompt
    buf.add("b", 7, _rows(7, 2))
    buf.add("a", 5, _rows(5, 3))  # its first round: root + 2 accepted
    buf.add("a", 8, _rows(8, 0))  # nothing
    spans, feats = buf.take(["b", "c", "a"])
    assert [(s.rid, s.start, s.count) for s in spans] == [("b", 7, 2), ("a", 0, 8)]
    assert feats[:, 0].tolist() == [7, 8, *range(8)]
    assert len(buf) == 0 and buf.take(["a"]) == ([], None)


def test_a_run_that_does_not_continue_replaces_and_reopen_keeps_only_a_prompt() -> None:
    buf = FeatureBuffer()
    buf.add("a", 10, _rows(10, 2))
    buf.add("a", 0, _rows(0, 4))  # a re-prefill after a retraction
    buf.keep_from_start("a")
    buf.add("b", 3, _rows(3, 1))
    buf.keep_from_start("b")  # the speculator holds nothing of b: position 3 would be a gap
    spans, feats = buf.take(["a", "b"])
    assert [(s.rid, s.start, s.count) for s in spans] == [("a", 0, 4)]
    assert feats[:, 0].tolist() == [0, 1, 2, 3]


def test_rows_are_copied_from_the_forward() -> None:
    hidden = _rows(0, 3)
    buf = FeatureBuffer()
    buf.add("a", 0, hidden[:2])
    hidden.zero_()  # the next forward reuses its capture buffer
    _, feats = buf.take(["a"])
    assert feats[:, 0].tolist() == [0, 1]


def test_long_runs_are_split_into_protocol_sized_spans(monkeypatch) -> None:
    monkeypatch.setattr(feature_buffer, "MAX_SPAN", 4)
    buf = FeatureBuffer()
    buf.add("a", 2, _rows(2, 9))
    spans, feats = buf.take(["a"])
    assert [(s.start, s.count) for s in spans] == [(2, 4), (6, 4), (10, 1)]
    assert feats.shape == (9, F)


def test_extend_features_start_after_each_prefix() -> None:
    hidden = torch.cat([_rows(0, 3), _rows(4, 2)])  # a new prompt, then a second chunk
    out = extend_features(hidden, prefix_lens=[0, 4], extend_lens=[3, 2])
    assert [(s, f[:, 0].tolist()) for s, f in out] == [(0, [0, 1, 2]), (4, [4, 5])]
    with pytest.raises(ValueError, match="the batch extends 6"):
        extend_features(hidden, [0, 4], [3, 3])


def test_verify_features_are_the_root_and_the_accepted_rows() -> None:
    width = 4
    seq_lens, accept = [10, 20], [2, 0]
    hidden = torch.cat([_rows(p, width) for p in seq_lens])
    out = verify_features(hidden, seq_lens, accept, width)
    assert [(s, f[:, 0].tolist()) for s, f in out] == [(10, [10, 11, 12]), (20, [20])]
    plain = verify_features(_rows(5, 1), [5], [0], 1)  # a plain round: its one position
    assert [(s, f[:, 0].tolist()) for s, f in plain] == [(5, [5])]
    with pytest.raises(ValueError, match="accept length 4"):
        verify_features(hidden, seq_lens, [4, 0], width)
    with pytest.raises(ValueError, match="expected 2×3"):
        verify_features(hidden, seq_lens, accept, 3)

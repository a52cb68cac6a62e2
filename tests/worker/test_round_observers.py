"""Round observers: the EAGLE-3 feature shipper asks every forward for its
features and ships the committed positions' to its sink; without a sink (a follower TP rank) it
still asks, so every rank's forward is the same, and ships nothing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

from sglang_ssd.worker.round_observers import FeatureShipper


class Sink:
    def __init__(self) -> None:
        self.got: list[tuple[list[str], list[tuple[int, torch.Tensor]]]] = []

    def add_features(self, rids: Any, rows: Any) -> None:
        self.got.append((list(rids), list(rows)))


def test_the_shipper_sends_prefill_and_committed_verify_features() -> None:
    sink = Sink()
    shipper = FeatureShipper(sink)
    assert shipper.forward_kwargs == {"capture_hidden_mode": CaptureHiddenMode.FULL}
    hidden = torch.arange(5 * 2, dtype=torch.float32).view(5, 2)
    batch = SimpleNamespace(prefix_lens=[0, 4], extend_lens=[3, 2])
    shipper.extended(["a", "b"], SimpleNamespace(hidden_states=hidden), batch)
    ((rids, rows),) = sink.got
    assert rids == ["a", "b"] and [start for start, _ in rows] == [0, 4]
    assert torch.equal(rows[1][1], hidden[3:5])

    verify = torch.arange(2 * 3 * 2, dtype=torch.float32).view(6, 2)  # 2 requests x W = 3
    shipper.verified(["a", "b"], SimpleNamespace(hidden_states=verify), [3, 6], [2, 0], 3)
    rids, rows = sink.got[1]
    assert [(start, feats.shape[0]) for start, feats in rows] == [(3, 3), (6, 1)]
    assert torch.equal(rows[1][1], verify[3:4])  # b's root only: nothing accepted


def test_a_shipper_without_a_sink_ships_nothing() -> None:
    shipper = FeatureShipper()
    broken = SimpleNamespace(hidden_states=None)  # would raise if it were read
    shipper.extended(["a"], broken, SimpleNamespace(prefix_lens=[0], extend_lens=[1]))
    shipper.verified(["a"], broken, [1], [0], 3)
    assert shipper.forward_kwargs["capture_hidden_mode"] == CaptureHiddenMode.FULL


def test_an_idle_batch_ships_nothing() -> None:
    """SGLang runs an idle batch (no request) through the prefill path with no logits output."""
    sink = Sink()
    FeatureShipper(sink).extended([], None, SimpleNamespace(prefix_lens=[], extend_lens=[]))
    assert sink.got == []

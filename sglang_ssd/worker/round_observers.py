"""Optional watchers of the target's forwards: `RoundObserver`, and `FeatureShipper`, the one
an EAGLE-3 head draft needs.

`SSDWorker` runs the same round for every draft; what a particular draft needs from the target's
forwards beyond the verified tokens is an observer's job. An observer names the keyword
arguments it wants on every target forward (all ranks pass them: with TP every rank runs the
same forward) and is told, on the leading rank, what each prefill and each verify round
computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

from sglang_ssd.worker.feature_buffer import extend_features, verify_features


class FeatureSink(Protocol):
    """Where shipped features go (`SpeculatorClient.add_features`)."""

    def add_features(
        self, rids: Sequence[str], rows: Sequence[tuple[int, torch.Tensor]]
    ) -> None: ...


class RoundObserver(Protocol):
    """What `SSDWorker` asks of an observer.

    Attributes:
        forward_kwargs: keyword arguments of every target forward
            (`TpModelWorker.forward_batch_generation`).
    """

    forward_kwargs: Mapping[str, Any]

    def extended(self, rids: Sequence[str], logits_output: Any, batch: Any) -> None:
        """A prefill forward of the requests `rids` (batch order) ran; `batch` is SGLang's
        `ScheduleBatch` (its `prefix_lens` and `extend_lens`)."""

    def verified(
        self,
        rids: Sequence[str],
        logits_output: Any,
        seq_lens: Sequence[int],
        accept_lens: Sequence[int],
        width: int,
    ) -> None:
        """A verify round committed, per request of `rids`, its root at `seq_lens[b]` and
        `accept_lens[b]` draft tokens; the forward had `width` positions per request."""


class FeatureShipper:
    """An EAGLE-3 head draft's observer: every target forward captures its features (FULL, so
    `logits_output.hidden_states` holds every position's, `eagle3_capture`), and the features of
    committed positions go to the speculator client, which sends them with the next Step.

    Attributes:
        sink: the speculator client on the leading rank; None elsewhere (a follower rank
            captures, since its forward must match the leader's, and ships nothing).
    """

    forward_kwargs: Mapping[str, Any] = {"capture_hidden_mode": CaptureHiddenMode.FULL}

    def __init__(self, sink: FeatureSink | None = None) -> None:
        self.sink = sink

    def extended(self, rids: Sequence[str], logits_output: Any, batch: Any) -> None:
        if self.sink is None or not rids:  # an idle batch has no logits output
            return
        rows = extend_features(logits_output.hidden_states, batch.prefix_lens, batch.extend_lens)
        self.sink.add_features(rids, rows)

    def verified(
        self,
        rids: Sequence[str],
        logits_output: Any,
        seq_lens: Sequence[int],
        accept_lens: Sequence[int],
        width: int,
    ) -> None:
        """Ships the root's and the accepted tokens' features (the bonus token's come next
        round, where it is the root)."""
        if self.sink is None or not rids:
            return
        rows = verify_features(logits_output.hidden_states, seq_lens, accept_lens, width)
        self.sink.add_features(rids, rows)

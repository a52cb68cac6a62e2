"""A speculator-side link whose messages are all queued before `SpeculatorServer.run` starts
(the server loop without processes or sockets)."""

from __future__ import annotations

from collections import deque

import torch

from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.transport import Drafts, Shutdown, Step


class QueuedLink:
    """The speculator's side of a link whose messages are all queued before the loop starts;
    records each Drafts reply with the fed length of every request when it was sent. A queued
    (Step, tensor) pair is a Step with its features (`SpeculatorLink.last_features`)."""

    def __init__(self, engine: SpeculatorEngine, messages: list) -> None:
        self.engine = engine
        self.inbox = deque(messages)
        self.replies: list[tuple[Drafts, dict[str, int]]] = []
        self.tensors: list[tuple[torch.Tensor, torch.Tensor | None]] = []  # (tokens, q) each
        self.sent: list = []
        self.last_features: torch.Tensor | None = None

    def recv(self, timeout_s: float):
        if self.inbox:
            msg = self.inbox.popleft()
            if isinstance(msg, tuple):  # (Step, its features tensor)
                msg, self.last_features = msg
            elif isinstance(msg, Step):
                self.last_features = None
            return msg
        return None if self.engine.prefill_pending() else Shutdown()

    def send(self, msg) -> None:
        self.sent.append(msg)

    def send_drafts(self, msg: Drafts, tokens: torch.Tensor, q: torch.Tensor | None) -> float:
        fed = {rid: s.num_fed for rid, s in self.engine.requests.items()}
        self.replies.append((msg, fed))
        self.tensors.append((tokens, q))
        return 0.0

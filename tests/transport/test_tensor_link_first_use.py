"""The tensor link is used once each way before it is up: torch builds the communicator of a
lone NCCL send/recv lazily at its first use (`ProcessGroupNCCL::pointToPoint`), which would
otherwise land in the first serving round. Gloo runs the same exchange, so it is tested here on
real two-rank gloo groups; NCCL's own run is in `tests/gpu` (two GPUs)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from sglang_ssd.transport import tensor_link
from sglang_ssd.transport.tensor_link import TensorLink, master_store
from sglang_ssd.transport.wire import TransportTimeout


class RecordingGroup:
    """A real process group whose sends and receives are recorded as (op, peer, values)."""

    def __init__(self, group: Any, log: list[tuple[str, int, list[int]]]) -> None:
        self.group, self.log = group, log

    def send(self, tensors: list[torch.Tensor], peer: int, tag: int) -> Any:
        self.log.append(("send", peer, tensors[0].tolist()))
        return self.group.send(tensors, peer, tag)

    def recv(self, tensors: list[torch.Tensor], peer: int, tag: int) -> Any:
        self.log.append(("recv", peer, []))
        return self.group.recv(tensors, peer, tag)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.group, name)


def _pair(monkeypatch: pytest.MonkeyPatch) -> tuple[TensorLink, TensorLink, dict[int, list]]:
    logs: dict[int, list] = {0: [], 1: []}
    make = tensor_link._make_group

    def recording(store, rank, backend, device, timeout_s):
        return RecordingGroup(make(store, rank, backend, device, timeout_s), logs[rank])

    monkeypatch.setattr(tensor_link, "_make_group", recording)
    store = master_store()
    out: dict[str, TensorLink] = {}
    thread = threading.Thread(target=lambda: out.setdefault("t", TensorLink(store, 0, "s")))
    thread.start()
    speculator = TensorLink.connect("127.0.0.1", store.port, "s")
    thread.join(30)
    return out["t"], speculator, logs


def test_each_side_sends_and_receives_once_before_the_link_is_up(monkeypatch) -> None:
    target, speculator, logs = _pair(monkeypatch)
    try:
        mark = tensor_link.FIRST_USE_MARK
        assert logs[0] == [("send", 1, [mark]), ("recv", 1, [])]
        assert logs[1] == [("recv", 0, []), ("send", 0, [mark + 1])]
        # Not counted as traffic; the link then carries tensors as before.
        assert target.sent.count == target.received.count == speculator.sent.count == 0
        thread = threading.Thread(target=lambda: target.send([torch.arange(3)]))
        thread.start()
        (got,) = speculator.recv([((3,), torch.int64)])
        thread.join(10)
        assert got.tolist() == [0, 1, 2]
    finally:
        target.close()
        speculator.close()


def test_a_peer_that_never_answers_the_first_use_fails_the_start() -> None:
    """The speculator's side joins the group but never exchanges: the target's link does not
    come up (a timeout), and it is closed."""
    store = master_store()
    joined: dict[str, Any] = {}

    def silent_peer() -> None:
        client = torch.distributed.TCPStore("127.0.0.1", store.port, 2, False)
        prefixed = torch.distributed.PrefixStore("sglang_ssd/s/", client)
        joined["group"] = tensor_link._make_group(prefixed, 1, "gloo", torch.device("cpu"), 5.0)

    thread = threading.Thread(target=silent_peer)
    thread.start()
    start = time.monotonic()
    with pytest.raises(TransportTimeout, match="first"):
        TensorLink(store, 0, "s", timeout_s=1.0)
    assert time.monotonic() - start < 10
    thread.join(10)
    joined["group"].shutdown()

"""`TargetLink` / `SpeculatorLink`: the SSD link as each side uses it.

The target starts the link (a bound control socket + the tensor store), hands the `LinkAddress`
to the speculator process it spawns, and `accept`s it; the speculator `connect`s with that
address. Per round the target sends a `Step` and receives the `Drafts` reply with its tensors
(tokens int64 [B, Dmax], q [Bq, Dmax, V] for the rows that carry q): only the chosen drafts
cross. Ordering rules, enforced here and logged, never raised on peer input:
- the target accepts only the Drafts answering its outstanding Step; older, duplicate and
  never-sent step ids are discarded *after* their tensors are received, so the tensor stream
  stays in step with the control stream (every valid Drafts is followed by its tensors);
- the speculator drops a Step whose step_id is ≤ the last one it received (a duplicate).
One link serves one speculator process; after any TransportError, close it and start a new one.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections import deque
from typing import NamedTuple, TypeVar

import msgspec
import torch

from sglang_ssd.transport.control import DEFAULT_SEND_TIMEOUT_S, ControlEndpoint
from sglang_ssd.transport.messages import (
    Close,
    Configure,
    ConfigureAck,
    Drafts,
    Error,
    Hello,
    Message,
    Open,
    Shutdown,
    StatsReply,
    StatsRequest,
    Step,
)
from sglang_ssd.transport.tensor_link import (
    TARGET_RANK,
    Backend,
    TensorLink,
    TensorSpec,
    master_store,
)
from sglang_ssd.transport.wire import (
    RemoteError,
    TransportError,
)

logger = logging.getLogger(__name__)

Reply = TypeVar("Reply", ConfigureAck, StatsReply)
_TO_SPECULATOR = (Open, Close, Configure, StatsRequest, Shutdown)
_FOR_SPECULATOR = (Step, *_TO_SPECULATOR, Error)
_REPLIES = (ConfigureAck, StatsReply, Error)
CLOSE_LINGER_S = 0.5


class LinkAddress(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything the speculator process needs to reach its target; JSON via `to_json`."""

    control: str  # the target's ZMQ endpoint, tcp://127.0.0.1:PORT or ipc://PATH
    store_host: str
    store_port: int  # the target's TCPStore (tensor link rendezvous)
    session: str  # shared secret checked in the handshake; scopes the store keys
    backend: Backend = "gloo"

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> LinkAddress:
        """Raises msgspec.ValidationError on a malformed address."""
        return msgspec.json.decode(text, type=cls)


class ReceivedDrafts(NamedTuple):
    """A `Drafts` reply with its tensors: tokens int64 [B, Dmax] (-1 padded) on the CPU, q
    [Bq, Dmax, W] on the link's device and the ids of q's W columns, int64 [W] on the CPU
    (None: W = V, every id in order)."""

    drafts: Drafts
    tokens: torch.Tensor
    q: torch.Tensor | None
    columns: torch.Tensor | None = None


def draft_specs(drafts: Drafts) -> list[TensorSpec]:
    """Shapes and dtypes of the tensors that follow ``drafts`` on the tensor link."""
    specs: list[TensorSpec] = [((len(drafts.entries), drafts.max_depth), torch.int64)]
    if drafts.n_q:
        shape = (drafts.n_q, drafts.max_depth, drafts.q_width)
        specs.append((shape, getattr(torch, drafts.q_dtype)))
    return specs


def feature_spec(step: Step) -> TensorSpec | None:
    """Shape and dtype of the features tensor that follows ``step`` (None: no features)."""
    if not step.features:
        return None
    return (step.feature_rows(), step.feature_size), getattr(torch, step.feature_dtype)


def check_draft_tensors(drafts: Drafts, tokens: torch.Tensor, q: torch.Tensor | None) -> str:
    """Why ``tokens``/``q`` do not match ``drafts``, or "" when they do.

    Row i holds entries[i].depth token ids in [0, vocab_size), then -1 up to max_depth. The
    ids are read on the host: a device `tokens` costs one device-to-host copy (pass host
    tokens where the caller has them).
    """
    specs = draft_specs(drafts)
    got = [tokens] if q is None else [tokens, q]
    if len(got) != len(specs):
        return f"expected {len(specs)} tensors (q only when an entry has_q), got {len(got)}"
    for name, tensor, (shape, dtype) in zip(("tokens", "q"), got, specs, strict=False):
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            return f"{name} is {tuple(tensor.shape)} {tensor.dtype}, expected {shape} {dtype}"
    tokens = tokens.cpu()
    depth = torch.tensor([e.depth for e in drafts.entries])
    inside = torch.arange(drafts.max_depth) < depth[:, None]
    valid = (tokens >= 0) & (tokens < drafts.vocab_size)
    if not torch.where(inside, valid, tokens == -1).all():
        return "tokens must be ids in [0, vocab_size) up to each depth and -1 after"
    return ""


class TargetLink:
    """Target side: owns the bound control socket and the tensor store (rank 0). One thread."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        control: str | None = None,
        backend: Backend = "gloo",
        device: torch.device | str | None = None,
        tensor_timeout_s: float = 30.0,
    ) -> None:
        """``control``: the ZMQ address to bind (default tcp on ``host``, free port); ``backend``
        "nccl" needs both sides on CUDA (``device`` is the target's); ``tensor_timeout_s`` bounds
        the tensor rendezvous and each transfer."""
        self._host, self._bind = host, control or f"tcp://{host}:*"
        self._backend, self._device, self._tensor_timeout_s = backend, device, tensor_timeout_s
        self.address: LinkAddress | None = None
        self.hello: Hello | None = None  # the speculator's, after accept
        self.q_columns: torch.Tensor | None = None  # its Hello.q_columns, int64 on the CPU
        self._control: ControlEndpoint | None = None
        self._store = None
        self._tensors: TensorLink | None = None
        self._step: Step | None = None  # the outstanding Step
        self._last_step_id = -1
        self._ready: ReceivedDrafts | None = None
        self._replies: deque[Message] = deque()

    def start(self, session: str | None = None) -> LinkAddress:
        """Bind the control socket and start the store; ``session`` defaults to a random token.

        Raises:
            TransportError: the control address cannot be bound.
        """
        session = session or secrets.token_hex(16)
        self._control = ControlEndpoint.bind(self._bind)
        self._store = master_store(self._host, self._tensor_timeout_s)
        self.address = LinkAddress(
            self._control.address, self._host, self._store.port, session, self._backend
        )
        return self.address

    def accept(self, timeout_s: float) -> Hello:
        """Handshake with the speculator, then join the tensor group. Returns its `Hello`.

        Raises:
            TransportError: handshake rejected (version/session) or the tensor group failed.
            TransportTimeout: no speculator within ``timeout_s`` (+ the tensor timeout).
        """
        if self._control is None or self.address is None:
            raise RuntimeError("call start() before accept()")
        self.hello = self._control.handshake(self.address.session, timeout_s)
        cols = self.hello.q_columns
        self.q_columns = None if cols is None else torch.tensor(cols, dtype=torch.int64)
        self._tensors = TensorLink(
            self._store,
            TARGET_RANK,
            self.address.session,
            self._backend,
            self._device,
            self._tensor_timeout_s,
        )
        return self.hello

    @property
    def tensors(self) -> TensorLink:
        """The tensor link (for its `TransferStats`); only after `accept`."""
        if self._tensors is None:
            raise RuntimeError("the link is not connected: call accept() first")
        return self._tensors

    def _connected(self) -> ControlEndpoint:
        if self._tensors is None or self._control is None or self._control.closed:
            raise RuntimeError("the link is not connected: call accept() first")
        return self._control

    def send_step(
        self,
        step: Step,
        timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
        features: torch.Tensor | None = None,
    ) -> None:
        """Send the round's Step; its step_id must exceed every earlier one. With
        ``step.features``, ``features`` (`feature_spec`) follows on the tensor link, which
        blocks until the speculator has received it (at most the tensor timeout).

        Any reply still pending for an earlier Step is drained (and discarded) first.
        Raises ValueError on a non-increasing step_id or features that do not match the Step,
        TransportTimeout if the send blocks, TransportError if the tensor transfer fails.
        """
        control = self._connected()
        if step.step_id <= self._last_step_id:
            raise ValueError(f"step_id {step.step_id} ≤ the last sent {self._last_step_id}")
        spec = feature_spec(step)
        got = None if features is None else (tuple(features.shape), features.dtype)
        if got != spec:
            raise ValueError(f"Step features {got}, the Step announces {spec}")
        while self._pump(0.0):
            pass
        if self._ready is not None:
            step_id = self._ready.drafts.step_id
            logger.warning("SSD target: drafts for step %d were never collected", step_id)
            self._ready = None
        control.send(step, timeout_s)
        self._step, self._last_step_id = step, step.step_id
        if features is not None:
            self.tensors.send([features])

    def recv_drafts(self, step_id: int, timeout_s: float) -> ReceivedDrafts | None:
        """The reply to the outstanding Step ``step_id``, or None after ``timeout_s`` seconds.

        ``timeout_s`` bounds the wait for the control message; its tensors then take at most
        the tensor timeout. Tensors are on the link's device (CPU for gloo).
        Raises ValueError if ``step_id`` is not outstanding, RemoteError if the speculator sent
        an `Error`, TransportError if the tensor transfer fails.
        """
        if self._step is None or step_id != self._step.step_id:
            raise ValueError(f"step {step_id} is not the outstanding step")
        deadline = time.monotonic() + timeout_s
        while self._ready is None:
            self._raise_remote_error()
            if not self._pump(deadline - time.monotonic()):
                return None
        ready, self._ready, self._step = self._ready, None, None
        return ready

    def send(self, msg: Message, timeout_s: float = DEFAULT_SEND_TIMEOUT_S) -> None:
        """Send Open, Close, Configure, StatsRequest or Shutdown (Step: `send_step`)."""
        if not isinstance(msg, _TO_SPECULATOR):
            raise ValueError(f"TargetLink.send cannot send {type(msg).__name__}")
        self._connected().send(msg, timeout_s)

    def recv_reply(self, kind: type[Reply], timeout_s: float) -> Reply | None:
        """The next `ConfigureAck` or `StatsReply` (``kind``), or None after ``timeout_s``.

        Raises RemoteError when the speculator sent an `Error` instead.
        """
        if kind not in (ConfigureAck, StatsReply):
            raise ValueError(f"not a reply type: {kind.__name__}")
        deadline = time.monotonic() + timeout_s
        while True:
            self._raise_remote_error()
            for reply in self._replies:
                if isinstance(reply, kind):
                    self._replies.remove(reply)
                    return reply
            if not self._pump(deadline - time.monotonic()):
                return None

    def _raise_remote_error(self) -> None:
        for reply in self._replies:
            if isinstance(reply, Error):
                self._replies.remove(reply)
                raise RemoteError(reply.reason)

    def _pump(self, timeout_s: float) -> bool:
        """Handle one incoming message; False when none arrived within ``timeout_s``."""
        msg = self._connected().recv(max(timeout_s, 0.0))
        if msg is None:
            return False
        if isinstance(msg, Drafts):
            received = self.tensors.recv(draft_specs(msg))  # always, to stay in step
            # The target reads the ids on the host (`drafts_reply`): one copy, checked there.
            tokens, q = received[0].cpu(), received[1] if len(received) > 1 else None
            reason = self._reject_drafts(msg) or check_draft_tensors(msg, tokens, q)
            if reason:
                logger.warning("SSD target: discarded Drafts step %d: %s", msg.step_id, reason)
            else:
                columns = self.q_columns if msg.q_columns else None
                self._ready = ReceivedDrafts(msg, tokens, q, columns)
        elif isinstance(msg, _REPLIES):
            self._replies.append(msg)
        else:
            logger.warning("SSD target: ignored unexpected %s", type(msg).__name__)
        return True

    def _reject_drafts(self, drafts: Drafts) -> str:
        step_id = drafts.step_id
        if step_id > self._last_step_id:
            return "future step (never sent)"
        if self._step is None or step_id < self._step.step_id:
            return "stale or duplicate step"
        if self._ready is not None:
            return "duplicate reply"
        if [e.rid for e in drafts.entries] != self._step.requests:
            return "entries do not match the Step's requests"
        announced = 0 if self.q_columns is None else self.q_columns.numel()
        if drafts.q_columns and drafts.q_columns != announced:
            return f"q has {drafts.q_columns} columns, the speculator's Hello announced {announced}"
        return ""

    def close(self) -> None:
        """Tell the speculator to shut down (best effort), then free socket, group and port."""
        if self._control is not None and not self._control.closed:
            if self._tensors is not None:
                with contextlib.suppress(TransportError):
                    self._control.send(Shutdown(), timeout_s=0.1)
            # Linger so the last message still reaches the peer: the Shutdown, or the HelloAck
            # that refused its handshake (else it times out instead of logging the reason).
            self._control.close(CLOSE_LINGER_S)
        if self._tensors is not None:
            self._tensors.close()
        self._tensors = self._store = None

    def __enter__(self) -> TargetLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SpeculatorLink:
    """Speculator side: the connected control socket and tensor group (rank 1). One thread."""

    def __init__(self, control: ControlEndpoint, tensors: TensorLink) -> None:
        """Use `connect`."""
        self._control, self.tensors = control, tensors
        self._last_step_id = -1
        self.last_features: torch.Tensor | None = None  # of the latest Step received

    @classmethod
    def connect(
        cls,
        address: LinkAddress | str,
        timeout_s: float,
        *,
        device: torch.device | str | None = None,
        tensor_timeout_s: float = 30.0,
        q_columns: list[int] | None = None,
    ) -> SpeculatorLink:
        """Connect to the target at ``address`` (a LinkAddress or its JSON) and handshake;
        ``q_columns``: the draft vocabulary's ids, announced in the `Hello` (None: every id).

        Raises:
            TransportError: the target rejected the handshake, or the tensor group failed.
            TransportTimeout: no answer within ``timeout_s`` (+ the tensor timeout).
        """
        if isinstance(address, str):
            address = LinkAddress.from_json(address)
        control = ControlEndpoint.connect(address.control)
        try:
            control.handshake(address.session, timeout_s, q_columns=q_columns)
            tensors = TensorLink.connect(
                address.store_host,
                address.store_port,
                address.session,
                address.backend,
                device,
                tensor_timeout_s,
            )
        except BaseException:
            control.close()
            raise
        return cls(control, tensors)

    def recv(self, timeout_s: float) -> Message | None:
        """The next message for the speculator, or None after ``timeout_s`` seconds.

        Returns Step (new ones only), Open, Close, Configure, StatsRequest, Shutdown or Error;
        duplicate Steps and messages meant for the target are logged and skipped. A Step's
        features tensor (`feature_spec`) is received with it, as `last_features` (None for a
        Step without features).
        """
        deadline = time.monotonic() + timeout_s
        while (msg := self._control.recv(max(deadline - time.monotonic(), 0.0))) is not None:
            spec = feature_spec(msg) if isinstance(msg, Step) else None
            if spec is not None:  # always, to stay in step with the tensor stream
                (self.last_features,) = self.tensors.recv([spec])
            elif isinstance(msg, Step):
                self.last_features = None
            if not isinstance(msg, _FOR_SPECULATOR):
                logger.warning("SSD speculator: ignored unexpected %s", type(msg).__name__)
            elif isinstance(msg, Step) and msg.step_id <= self._last_step_id:
                logger.warning(
                    "SSD speculator: ignored Step %d (already at %d: duplicate or reordered)",
                    msg.step_id,
                    self._last_step_id,
                )
            else:
                if isinstance(msg, Step):
                    self._last_step_id = msg.step_id
                return msg
        return None

    def send_drafts(
        self, drafts: Drafts, tokens: torch.Tensor, q: torch.Tensor | None = None
    ) -> float:
        """Send the reply to a received Step, then its tensors; returns the tensor seconds.

        ``tokens``: int64 [len(entries), max_depth], -1 after each row's depth; ``q``: the
        chosen rows' q, `q_dtype` [n_q, max_depth, q_width], or None when no entry has_q.
        Blocks until the target has received the tensors (at most the tensor timeout).

        Raises:
            ValueError: a step never received, or tensors that do not match ``drafts``.
            TransportError / TransportTimeout: the transfer failed / timed out.
        """
        if drafts.step_id > self._last_step_id:
            raise ValueError(f"Drafts for step {drafts.step_id}, which was never received")
        reason = check_draft_tensors(drafts, tokens, q)
        if reason:
            raise ValueError(reason)
        self._control.send(drafts)
        return self.tensors.send([tokens] if q is None else [tokens, q])

    def send(self, msg: Message, timeout_s: float = DEFAULT_SEND_TIMEOUT_S) -> None:
        """Send ConfigureAck, StatsReply or Error (Drafts: `send_drafts`)."""
        if not isinstance(msg, _REPLIES):
            raise ValueError(f"SpeculatorLink.send cannot send {type(msg).__name__}")
        self._control.send(msg, timeout_s)

    def close(self) -> None:
        """Close the socket and leave the tensor group; idempotent."""
        self._control.close()
        self.tensors.close()

    def __enter__(self) -> SpeculatorLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

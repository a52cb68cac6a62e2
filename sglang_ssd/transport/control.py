"""`ControlEndpoint`: one end of the ZMQ PAIR socket that carries the control messages.

The target binds (``tcp://127.0.0.1:*`` picks a free port, or an ``ipc://`` path), the
speculator connects. Each message is one msgpack frame (`messages.encode` / `messages.decode`).
Waiting uses `zmq.Poller` with a timeout in seconds: no busy-wait, no unbounded wait. Bytes from
the peer are untrusted: a frame that does not decode to a valid message is logged
(``logger.warning`` with the reason), counted in `rejected` and skipped, and `recv` keeps
waiting for a valid one until its deadline. Not thread-safe: use an endpoint from one thread.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Literal, TypeVar

import msgspec
import zmq

from sglang_ssd.transport.messages import (
    PROTOCOL_VERSION,
    Hello,
    HelloAck,
    Message,
    decode,
    encode,
)
from sglang_ssd.transport.wire import (
    TransportError,
    TransportTimeout,
)

logger = logging.getLogger(__name__)

MAX_FRAME_BYTES = 64 * 2**20  # zmq drops a peer that sends more; Open with a long prompt ≈ 1 MB
DEFAULT_SEND_TIMEOUT_S = 5.0
Side = Literal["target", "speculator"]
_Reply = TypeVar("_Reply", Hello, HelloAck)


class ControlEndpoint:
    """One side of the control channel. Build with `bind` (target) or `connect` (speculator)."""

    def __init__(self, side: Side, address: str) -> None:
        """Create the socket and bind (target) or connect (speculator) it to ``address``."""
        self.side: Side = side
        self.rejected = 0  # frames dropped as malformed, unknown or out of range
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.PAIR)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        try:
            if side == "target":
                self._sock.bind(address)
                address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                self._sock.connect(address)
        except zmq.ZMQError as err:
            self.close()
            raise TransportError(f"control socket cannot use {address}: {err}") from err
        self.address = address

    @classmethod
    def bind(cls, address: str = "tcp://127.0.0.1:*") -> ControlEndpoint:
        """Target side. ``address``: ``tcp://HOST:PORT`` (``*`` = a free port) or ``ipc://PATH``.

        Raises:
            TransportError: the address cannot be bound (in use, bad path).
        """
        return cls("target", address)

    @classmethod
    def connect(cls, address: str) -> ControlEndpoint:
        """Speculator side: connect to the target's `address` (connecting never blocks)."""
        return cls("speculator", address)

    @property
    def closed(self) -> bool:
        """True after `close`."""
        return self._sock.closed

    def send(self, msg: Message, timeout_s: float = DEFAULT_SEND_TIMEOUT_S) -> None:
        """Queue ``msg`` for the peer.

        Raises:
            TypeError, ValueError: ``msg`` is not a valid message (see `messages.encode`).
            TransportTimeout: the socket stayed full (or, target side, had no peer) for
                ``timeout_s`` seconds.
        """
        frame = encode(msg)
        if not self._sock.poll(_ms(timeout_s), zmq.POLLOUT):
            raise TransportTimeout(f"control send of {type(msg).__name__} timed out")
        try:
            self._sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # the peer went away between the poll and the send
            raise TransportTimeout(f"control send of {type(msg).__name__}: peer gone") from None

    def recv(self, timeout_s: float) -> Message | None:
        """The next valid message, or None when none arrives within ``timeout_s`` seconds.

        Invalid frames are logged and skipped (never raised); the wait goes on until the deadline.
        """
        deadline = time.monotonic() + timeout_s
        while self._poller.poll(_ms(deadline - time.monotonic())):
            msg = self._decode(self._sock.recv_multipart(zmq.NOBLOCK))
            if msg is not None:
                return msg
            if time.monotonic() >= deadline:  # a stream of bad frames must not extend the wait
                break
        return None

    def _decode(self, frames: list[bytes]) -> Message | None:
        if len(frames) != 1:
            return self._reject(frames, f"{len(frames)} frames, expected 1")
        try:
            return decode(frames[0])
        except msgspec.DecodeError as err:  # ValidationError included
            return self._reject(frames, str(err))

    def _reject(self, frames: list[bytes], reason: str) -> None:
        self.rejected += 1
        size = sum(len(frame) for frame in frames)
        head = frames[0][:32] if frames else b""
        logger.warning(
            "SSD %s: rejected control frame (%d bytes, starts %r): %s",
            self.side,
            size,
            head,
            reason,
        )

    def handshake(
        self,
        session: str,
        timeout_s: float,
        version: int = PROTOCOL_VERSION,
        q_columns: list[int] | None = None,
    ) -> Hello | HelloAck:
        """Check that both ends speak the same protocol version for the same session.

        Speculator: sends `Hello` and waits for the `HelloAck`, returning it. Target: waits for
        the `Hello` (other messages are logged and skipped), answers it, returns the `Hello`.
        ``version`` overrides the advertised version (tests); ``q_columns`` (speculator): the
        draft vocabulary's ids its Hello announces (`Hello.q_columns`).

        Raises:
            TransportError: version, role or session mismatch; raised on both sides, and the
                target tells the speculator why (``HelloAck.reason``).
            TransportTimeout: no Hello / HelloAck within ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        if self.side == "speculator":
            hello = Hello(
                version=version,
                role="speculator",
                pid=os.getpid(),
                session=session,
                q_columns=q_columns,
            )
            self.send(hello, timeout_s)
            ack = self._wait_for(HelloAck, deadline)
            if not ack.accepted:
                raise TransportError(f"target rejected the handshake: {ack.reason}")
            if ack.version != version:
                raise TransportError(
                    f"protocol version mismatch: target {ack.version}, speculator {version}"
                )
            return ack
        hello = self._wait_for(Hello, deadline)
        reason = _mismatch(hello, session, version)
        self.send(
            HelloAck(version=version, accepted=not reason, reason=reason),
            max(deadline - time.monotonic(), 0.0),
        )
        if reason:
            raise TransportError(f"speculator handshake rejected: {reason}")
        return hello

    def _wait_for(self, kind: type[_Reply], deadline: float) -> _Reply:
        while True:
            msg = self.recv(max(deadline - time.monotonic(), 0.0))
            if msg is None:
                raise TransportTimeout(f"SSD {self.side}: no {kind.__name__} before the timeout")
            if isinstance(msg, kind):
                return msg
            logger.warning("SSD %s: ignored %s during handshake", self.side, type(msg).__name__)

    def close(self, linger_s: float = 0.0) -> None:
        """Close the socket and its context; idempotent.

        ``linger_s``: how long queued outgoing messages may still be flushed (0 drops them).
        """
        if not self._sock.closed:
            self._sock.close(linger=_ms(linger_s))
        if not self._ctx.closed:
            self._ctx.term()

    def __enter__(self) -> ControlEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _mismatch(hello: Hello, session: str, version: int) -> str:
    if hello.version != version:
        return f"protocol version mismatch: target {version}, speculator {hello.version}"
    if hello.role != "speculator":
        return f"role {hello.role!r} cannot connect to a target"
    if hello.session != session:
        return "session mismatch: the speculator was started for another link"
    return ""


def _ms(seconds: float) -> int:
    """Seconds → whole milliseconds for zmq, rounded up so a short wait is not a zero poll."""
    return max(0, math.ceil(seconds * 1000))

"""ControlEndpoint over real sockets: timeouts, handshake, fuzz at both ends, clean close."""

from __future__ import annotations

import logging
import threading
import time

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_ssd.transport import messages as m
from sglang_ssd.transport import wire
from sglang_ssd.transport.control import ControlEndpoint

STEP = m.Step(step_id=1, outcomes=[], requests=["a"], backup="jit")
SENTINEL = m.Error(reason="sentinel")


def _endpoint_and_raw_peer(side: str) -> tuple[ControlEndpoint, zmq.Socket]:
    """An endpoint of ``side`` and a bare PAIR socket as its peer (sends arbitrary bytes)."""
    peer = zmq.Context.instance().socket(zmq.PAIR)
    peer.setsockopt(zmq.LINGER, 0)
    if side == "target":
        endpoint = ControlEndpoint.bind()
        peer.connect(endpoint.address)
    else:
        port = peer.bind_to_random_port("tcp://127.0.0.1")
        endpoint = ControlEndpoint.connect(f"tcp://127.0.0.1:{port}")
    return endpoint, peer


def test_recv_times_out_without_busy_wait() -> None:
    with ControlEndpoint.bind() as target:
        start_cpu, start = time.process_time(), time.monotonic()
        assert target.recv(0.3) is None
        assert 0.29 <= time.monotonic() - start < 2.0
        assert time.process_time() - start_cpu < 0.1  # polled, not spun


def test_send_without_peer_times_out() -> None:
    with ControlEndpoint.bind() as target, pytest.raises(wire.TransportTimeout):
        target.send(STEP, timeout_s=0.1)


def test_messages_flow_both_ways_over_ipc(tmp_path) -> None:
    path = f"ipc://{tmp_path}/ctl"
    with ControlEndpoint.bind(path) as target, ControlEndpoint.connect(path) as spec:
        spec.send(SENTINEL)
        assert target.recv(2.0) == SENTINEL
        target.send(STEP)
        assert spec.recv(2.0) == STEP


def _handshake_pair(target_session: str, spec_session: str, version: int = m.PROTOCOL_VERSION):
    target = ControlEndpoint.bind()
    spec = ControlEndpoint.connect(target.address)
    result: dict = {}

    def speculator() -> None:
        try:
            result["ack"] = spec.handshake(spec_session, 3.0, version=version)
        except wire.TransportError as err:
            result["error"] = err

    thread = threading.Thread(target=speculator)
    thread.start()
    try:
        result["hello"] = target.handshake(target_session, 3.0)
    except wire.TransportError as err:
        result["target_error"] = err
    thread.join(5.0)
    target.close()
    spec.close()
    return result


def test_handshake_accepts_matching_peer() -> None:
    result = _handshake_pair("s1", "s1")
    assert result["ack"].accepted and result["hello"].session == "s1"


@pytest.mark.parametrize(
    "spec_session,version,why",
    [("s1", m.PROTOCOL_VERSION + 1, "version mismatch"), ("other", m.PROTOCOL_VERSION, "session")],
)
def test_handshake_rejects_mismatch_on_both_sides(spec_session, version, why) -> None:
    result = _handshake_pair("s1", spec_session, version)
    assert why in str(result["target_error"]) and why in str(result["error"])
    assert not isinstance(result["error"], wire.TransportTimeout)


def test_handshake_times_out() -> None:
    with ControlEndpoint.bind() as target, pytest.raises(wire.TransportTimeout):
        target.handshake("s", 0.2)
    with ControlEndpoint.connect("tcp://127.0.0.1:9") as spec, pytest.raises(wire.TransportTimeout):
        spec.handshake("s", 0.2)  # nobody there: the Hello is queued, no ack comes


def test_port_is_released_on_close() -> None:
    first = ControlEndpoint.bind()
    address = first.address
    first.close()
    first.close()  # idempotent
    with ControlEndpoint.bind(address) as second:
        assert second.address == address


def test_bind_failure_is_a_transport_error() -> None:
    with ControlEndpoint.bind() as first, pytest.raises(wire.TransportError, match="cannot use"):
        ControlEndpoint.bind(first.address)


# --- fuzz at live endpoints ----------------------------------------------------------------

GOOD = [m.encode(msg) for msg in (STEP, SENTINEL, m.Shutdown(), m.StatsRequest())]
anything = st.recursive(
    st.none() | st.integers(-(2**63), 2**63) | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


@st.composite
def bad_frames(draw: st.DrawFn) -> list[bytes]:
    kind = draw(
        st.sampled_from(["bytes", "truncated", "garbled", "shape", "tag", "range", "multi"])
    )
    good = draw(st.sampled_from(GOOD))
    if kind == "bytes":
        return [draw(st.binary(max_size=48))]
    if kind == "truncated":
        return [good[: draw(st.integers(0, len(good) - 1))]]
    if kind == "garbled":
        pos = draw(st.integers(0, len(good) - 1))
        return [good[:pos] + draw(st.binary(min_size=1, max_size=4)) + good[pos + 1 :]]
    if kind == "shape":
        return [msgspec.msgpack.encode(draw(anything))]
    if kind == "tag":
        return [msgspec.msgpack.encode({"type": draw(st.text(max_size=10)), "reason": "x"})]
    if kind == "range":
        step_id = draw(st.integers(-(2**63), -1))
        return [msgspec.msgpack.encode(msgspec.to_builtins(STEP) | {"step_id": step_id})]
    return [good, good]  # a multi-part message


def _fuzz_endpoint(endpoint: ControlEndpoint, peer: zmq.Socket, frames, caplog) -> None:
    try:
        expected = m.decode(frames[0]) if len(frames) == 1 else None
    except msgspec.DecodeError:
        expected = None
    caplog.clear()
    rejected = endpoint.rejected
    peer.send_multipart(frames)
    peer.send(m.encode(SENTINEL))
    if expected is not None:  # a garbled frame can still be a valid message: it is delivered
        assert endpoint.recv(5.0) == expected
    assert endpoint.recv(5.0) == SENTINEL
    if expected is None:
        assert endpoint.rejected == rejected + 1
        assert any("rejected control frame" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("side", ["target", "speculator"])
def test_live_endpoint_fuzz(side: str, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="sglang_ssd.transport.control")
    endpoint, peer = _endpoint_and_raw_peer(side)
    examples = []

    @settings(
        max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    @given(bad_frames())
    def run(frames: list[bytes]) -> None:
        examples.append(frames)
        _fuzz_endpoint(endpoint, peer, frames, caplog)

    try:
        run()
        assert endpoint.rejected >= 50 and len(examples) >= 100
        endpoint.send(STEP)  # and the endpoint still sends
        assert m.decode(peer.recv()) == STEP
    finally:
        peer.close()
        endpoint.close()


def test_a_flood_of_bad_frames_does_not_extend_the_wait(caplog) -> None:
    endpoint, peer = _endpoint_and_raw_peer("target")
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            try:
                peer.send(b"\xc1", zmq.NOBLOCK)
            except zmq.Again:  # queue full: never block, so the thread can stop
                time.sleep(0.001)

    thread = threading.Thread(target=flood, daemon=True)
    with caplog.at_level(logging.ERROR):  # keep the log quiet
        thread.start()
        start = time.monotonic()
        try:
            assert endpoint.recv(0.2) is None
            assert time.monotonic() - start < 1.0 and endpoint.rejected > 0
        finally:
            stop.set()
            thread.join(2.0)
            peer.close()
            endpoint.close()

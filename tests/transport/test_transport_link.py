"""TargetLink / SpeculatorLink in two threads over real sockets and a real gloo group."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_ssd.transport import (
    ControlEndpoint,
    LinkAddress,
    SpeculatorLink,
    TargetLink,
    TensorLink,
    wire,
)
from sglang_ssd.transport import messages as m
from sglang_ssd.transport.tensor_link import master_store

V = 11
FUZZ = settings(
    max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None
)


def make_drafts(step_id: int, rids: list[str], mark: int = 0, depth: int = 3):
    """Drafts where even rows carry q; tokens and q encode (step_id, mark) for checking."""
    entries = [
        m.DraftEntry(
            rid=rid,
            source="cache" if i % 2 == 0 else "ngram",
            depth=depth - i % 2,
            has_q=i % 2 == 0,
        )
        for i, rid in enumerate(rids)
    ]
    drafts = m.Drafts(step_id=step_id, entries=entries, max_depth=depth, vocab_size=V)
    tokens = torch.full((len(rids), depth), (step_id + mark) % V, dtype=torch.int64)
    for i, entry in enumerate(entries):
        tokens[i, entry.depth :] = -1
    q = torch.full((drafts.n_q, depth, V), float(step_id * 100 + mark)) if drafts.n_q else None
    return drafts, tokens, q


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as err:  # handed to the test thread
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def joined(thread: threading.Thread, out: dict, timeout_s: float = 10.0):
    thread.join(timeout_s)
    assert not thread.is_alive(), "peer thread hung"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def linked_pair() -> tuple[TargetLink, SpeculatorLink]:
    target = TargetLink(tensor_timeout_s=10.0)
    address = target.start()
    thread, out = in_thread(lambda: SpeculatorLink.connect(address.to_json(), 5.0))
    target.accept(5.0)
    return target, joined(thread, out)


def test_rounds_replies_and_shutdown() -> None:
    target, spec = linked_pair()
    assert target.hello.role == "speculator"

    def speculator() -> list[str]:
        seen = []
        while (msg := spec.recv(5.0)) is not None:
            seen.append(type(msg).__name__)
            if isinstance(msg, m.Step):
                spec.send_drafts(*make_drafts(msg.step_id, msg.requests))
            elif isinstance(msg, m.Configure):
                applied = wire.LiveSettings(
                    fanout_budget=4,
                    fanout="uniform",
                    beta=msg.changes.beta,
                    backup="jit",
                    mode="auto",
                )
                spec.send(m.ConfigureAck(applied=applied))
            elif isinstance(msg, m.StatsRequest):
                spec.send(m.Error(reason="no stats yet"))
            elif isinstance(msg, m.Shutdown):
                spec.close()
                return seen
        return seen

    thread, out = in_thread(speculator)
    target.send(m.Open(rid="a", token_ids=[1, 2], sampling=m.SamplingSpec(1.0, -1, 1.0)))
    for step_id in (1, 2, 5):
        target.send_step(m.Step(step_id=step_id, outcomes=[], requests=["a", "b"], backup="jit"))
        drafts, tokens, q, columns = target.recv_drafts(step_id, 5.0)
        want = make_drafts(step_id, ["a", "b"])
        assert drafts == want[0] and torch.equal(tokens, want[1]) and torch.equal(q, want[2])
        assert columns is None and target.q_columns is None  # no Hello.q_columns: every id
    target.send_step(m.Step(step_id=6, outcomes=[], requests=[], backup="random"))
    empty = target.recv_drafts(6, 5.0)
    assert empty.tokens.shape == (0, 3) and empty.q is None
    target.send(m.Configure(changes=wire.LiveSettings(beta=0.5)))
    assert target.recv_reply(m.ConfigureAck, 5.0).applied.beta == 0.5
    target.send(m.StatsRequest())
    with pytest.raises(wire.RemoteError, match="no stats yet"):
        target.recv_reply(m.StatsReply, 5.0)
    assert target.tensors.received.count == 4  # the empty round moved no tensors
    target.close()
    assert joined(thread, out)[-1] == "Shutdown"


def test_api_misuse_raises_value_error() -> None:
    target, spec = linked_pair()
    try:
        step = m.Step(step_id=3, outcomes=[], requests=["a"], backup="jit")
        target.send_step(step)
        with pytest.raises(ValueError, match="last sent"):
            target.send_step(step)
        with pytest.raises(ValueError, match="outstanding"):
            target.recv_drafts(2, 0.1)
        with pytest.raises(ValueError, match="cannot send"):
            target.send(step)
        assert target.recv_drafts(3, 0.1) is None  # timeout: None, still outstanding
        with pytest.raises(ValueError, match="never received"):
            spec.send_drafts(*make_drafts(3, ["a"]))
        assert spec.recv(5.0) == step
        drafts, tokens, q = make_drafts(3, ["a"])
        with pytest.raises(ValueError, match="expected"):
            spec.send_drafts(drafts, tokens.float(), q)
        with pytest.raises(ValueError, match="-1 after"):
            spec.send_drafts(drafts, torch.full_like(tokens, V), q)
        with pytest.raises(ValueError, match="cannot send"):
            spec.send(drafts)
    finally:
        target.close()
        spec.close()


def test_timeouts_do_not_hang() -> None:
    target = TargetLink()
    address = target.start("s")
    with pytest.raises(wire.TransportTimeout):
        target.accept(0.2)
    target.close()
    with pytest.raises(wire.TransportTimeout):
        SpeculatorLink.connect(address, 0.2)


def test_close_releases_ports() -> None:
    target, spec = linked_pair()
    address = target.address
    spec.close()
    target.close()
    target.close()
    with ControlEndpoint.bind(address.control):
        pass
    dist.TCPStore("127.0.0.1", address.store_port, 2, True, wait_for_workers=False)


def test_link_address_json() -> None:
    address = LinkAddress("tcp://127.0.0.1:1", "127.0.0.1", 2, "s", "gloo")
    assert LinkAddress.from_json(address.to_json()) == address
    with pytest.raises(Exception, match="unknown field"):
        LinkAddress.from_json('{"control":"x","store_host":"h","store_port":1,"session":"s","x":1}')


# --- ordering fuzz at the live endpoints -----------------------------------------------------


def fake_speculator(address: LinkAddress) -> tuple[ControlEndpoint, TensorLink]:
    """A speculator made of the raw pieces, so it can break the rules SpeculatorLink enforces."""
    control = ControlEndpoint.connect(address.control)
    control.handshake(address.session, 5.0)
    return control, TensorLink.connect("127.0.0.1", address.store_port, address.session)


@pytest.fixture
def target_and_fake():
    target = TargetLink(tensor_timeout_s=10.0)
    address = target.start()
    thread, out = in_thread(lambda: fake_speculator(address))
    target.accept(5.0)
    control, tensors = joined(thread, out)
    yield target, control, tensors
    target.close()
    control.close()
    tensors.close()


replies = st.lists(st.sampled_from([-3, -1, 0, 0, 1, 4, "step", "garbage"]), max_size=6)


def test_target_keeps_only_the_outstanding_reply(target_and_fake, caplog) -> None:
    target, control, tensors = target_and_fake
    caplog.set_level(logging.WARNING)
    step_ids = iter(range(10, 10_000, 10))
    examples = []

    @FUZZ
    @given(replies)
    def run(offsets: list) -> None:
        examples.append(offsets)
        step_id, rids = next(step_ids), ["x", "y", "z"]
        target.send_step(m.Step(step_id=step_id, outcomes=[], requests=rids, backup="jit"))

        def speculator() -> None:
            for mark, offset in enumerate(offsets, start=1):
                if offset == "garbage":
                    control._sock.send(b"\xc1 not msgpack")
                elif offset == "step":  # a message meant for the speculator
                    control.send(m.Step(step_id=1, outcomes=[], requests=[], backup="jit"))
                else:
                    drafts, tokens, q = make_drafts(step_id + offset, rids, mark)
                    control.send(drafts)
                    tensors.send([tokens, q])
            control.send(m.StatsReply(stats=m.SpeculatorStats()))

        caplog.clear()
        thread, out = in_thread(speculator)
        got = target.recv_drafts(step_id, 5.0 if 0 in offsets else 0.2)
        assert target.recv_reply(m.StatsReply, 5.0) is not None  # drains what is left
        joined(thread, out)
        if 0 in offsets:
            mark = offsets.index(0) + 1
            assert got.q[0, 0, 0] == step_id * 100 + mark  # the first valid reply, its tensors
        else:
            assert got is None
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == len(offsets) - (0 in offsets)

    run()
    assert len(examples) >= 10


steps = st.lists(st.sampled_from([-2, 0, 0, 1, 2, 5, "drafts", "garbage"]), max_size=8)


def test_speculator_drops_duplicate_and_old_steps(caplog) -> None:
    store = master_store()
    control = ControlEndpoint.bind()
    address = LinkAddress(control.address, "127.0.0.1", store.port, "s")
    thread, out = in_thread(lambda: SpeculatorLink.connect(address, 5.0))
    control.handshake("s", 5.0)
    tensors = TensorLink(store, 0, "s")
    spec = joined(thread, out)
    caplog.set_level(logging.WARNING)
    base = iter(range(100, 100_000, 100))
    examples = []

    @FUZZ
    @given(steps)
    def run(offsets: list) -> None:
        examples.append(offsets)
        start, expected, last = next(base), [], -1
        for offset in offsets:
            if offset == "garbage":
                control._sock.send(b"\x92\x01")
            elif offset == "drafts":  # a message meant for the target
                control.send(make_drafts(0, [])[0])
            else:
                step_id = start + offset
                control.send(m.Step(step_id=step_id, outcomes=[], requests=[], backup="jit"))
                if step_id > max(last, start - 50):
                    expected.append(step_id)
                    last = step_id
        control.send(m.StatsRequest())
        caplog.clear()
        got = []
        while not isinstance(msg := spec.recv(5.0), m.StatsRequest):
            got.append(msg.step_id)
        assert got == expected
        assert len(caplog.records) == len(offsets) - len(expected)

    try:
        run()
        assert len(examples) >= 10
    finally:
        spec.close()
        control.close()
        tensors.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_nccl_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(wire.TransportError, match="CUDA"):
        TensorLink(master_store(), 0, "s", backend="nccl", timeout_s=1.0)


def test_step_features_follow_on_the_tensor_link() -> None:
    """A Step with feature spans carries its [Σ count, F] tensor to the speculator, which gets
    it as `last_features`; the next Step without spans clears it; a tensor unlike the Step's
    announcement is refused before anything is sent."""
    target, spec = linked_pair()
    spans = [m.FeatureSpan(rid="a", start=0, count=3), m.FeatureSpan(rid="b", start=7, count=2)]
    feats = torch.arange(5 * 4, dtype=torch.float32).view(5, 4)

    def speculator() -> list:
        got = []
        while (msg := spec.recv(5.0)) is not None and isinstance(msg, m.Step):
            got.append(spec.last_features)
            spec.send_drafts(*make_drafts(msg.step_id, msg.requests))
        spec.close()
        return got

    thread, out = in_thread(speculator)
    with_feats = m.Step(
        step_id=1,
        outcomes=[],
        requests=["a"],
        backup="jit",
        features=spans,
        feature_size=4,
        feature_dtype="float32",
    )
    with pytest.raises(ValueError, match="announces"):
        target.send_step(with_feats, features=feats[:4])
    target.send_step(with_feats, features=feats)
    target.recv_drafts(1, 5.0)
    target.send_step(m.Step(step_id=2, outcomes=[], requests=["a"], backup="jit"))
    target.recv_drafts(2, 5.0)
    target.send(m.Shutdown())
    got = joined(thread, out)
    target.close()
    assert torch.equal(got[0], feats) and got[1] is None
    with pytest.raises(ValueError, match="feature_size"):
        m.Step(step_id=3, outcomes=[], requests=[], backup="jit", features=spans)


def test_q_travels_at_the_columns_the_hello_announced() -> None:
    """A speculator with a draft vocabulary announces its ids in `Hello`;
    its q then crosses at that width and arrives with the ids of its columns. A reply whose
    width disagrees with the Hello is discarded, not misread."""
    cols = [0, 3, 4, 9]
    target = TargetLink(tensor_timeout_s=10.0)
    address = target.start()
    thread, out = in_thread(lambda: SpeculatorLink.connect(address.to_json(), 5.0, q_columns=cols))
    assert target.accept(5.0).q_columns == cols
    spec = joined(thread, out)
    try:
        assert torch.equal(target.q_columns, torch.tensor(cols))
        for step_id, width in ((1, len(cols)), (2, 3)):
            target.send_step(m.Step(step_id=step_id, outcomes=[], requests=["a"], backup="jit"))
            assert spec.recv(5.0).step_id == step_id
            entry = m.DraftEntry(rid="a", source="cache", depth=2, has_q=True)
            drafts = m.Drafts(
                step_id=step_id, entries=[entry], max_depth=2, vocab_size=V, q_columns=width
            )
            q = torch.full((1, 2, width), 0.25)
            send = functools.partial(spec.send_drafts, drafts, torch.tensor([[3, 9]]), q)
            thread, out = in_thread(send)
            got = target.recv_drafts(step_id, 5.0 if width == len(cols) else 0.3)
            joined(thread, out)
            if width == len(cols):
                assert torch.equal(got.q, q) and torch.equal(got.columns, torch.tensor(cols))
            else:
                assert got is None  # 3 columns against the 4 announced: discarded
    finally:
        spec.close()
        target.close()


@pytest.mark.parametrize("before", [None, "3"])
def test_the_nccl_group_alone_is_built_not_to_end_the_process(monkeypatch, before) -> None:
    """Torch reads TORCH_NCCL_ASYNC_ERROR_HANDLING in each ProcessGroupNCCL's
    constructor; the link's group is built with CleanUpOnly (2), so its watchdog aborts the
    communicator of a failed transfer instead of rethrowing on its own thread (which ends the
    scheduler), and the variable is put back for every other group (SGLang's)."""
    from sglang_ssd.transport import tensor_link

    seen: list[str | None] = []

    class Recorder:
        def __init__(self, store, rank, size, opts) -> None:
            seen.append(os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"))

    monkeypatch.setattr(dist, "ProcessGroupNCCL", Recorder, raising=False)  # CPU torch: none
    if before is None:
        monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    else:
        monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", before)
    group = tensor_link.nccl_group(None, 0, None)
    assert isinstance(group, Recorder) and seen == ["2"]
    assert os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == before


def test_a_speculator_gone_between_drafts_and_tensors_is_a_transport_error() -> None:
    """On the CPU's path: the Drafts message arrives, its tensors never do
    (the speculator died in between). The target's receive fails as `TransportError` within
    the tensor timeout, through the same `TensorLink._wait` the NCCL link uses, so the
    supervisor restarts the speculator and the round is served by backup drafts."""
    target = TargetLink(tensor_timeout_s=2.0)
    address = target.start()
    thread, out = in_thread(lambda: SpeculatorLink.connect(address.to_json(), 5.0))
    target.accept(5.0)
    spec = joined(thread, out)
    try:
        target.send_step(m.Step(step_id=1, outcomes=[], requests=["a"], backup="jit"))
        assert spec.recv(5.0).step_id == 1
        drafts, _, _ = make_drafts(1, ["a"])
        spec._control.send(drafts)  # the message, then the process dies: no tensors follow
        spec.tensors.close()
        with pytest.raises(wire.TransportError, match="tensor link recv"):
            target.recv_drafts(1, 5.0)
    finally:
        spec.close()
        target.close()

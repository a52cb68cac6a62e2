"""The link across two real processes (multiprocessing spawn): handshake, rounds, shutdown."""

from __future__ import annotations

import multiprocessing as mp
import statistics

import pytest
import torch

from sglang_ssd.transport import (
    PROTOCOL_VERSION,
    ControlEndpoint,
    LinkAddress,
    SpeculatorLink,
    TargetLink,
    wire,
)
from sglang_ssd.transport import messages as m

V, D = 151936, 4  # Qwen2.5 vocabulary, lookahead 4: q is [B, 4, 151936] float32 for B rows


def _fill(step_id: int, row: int) -> float:
    return float(step_id * 10 + row)


def speculator_main(address_json: str) -> None:
    """Child process: serve Steps until Shutdown; tokens and q encode (step, row) for checking."""
    link = SpeculatorLink.connect(address_json, 20.0)
    opened: set[str] = set()
    send_s: list[float] = []
    while (msg := link.recv(20.0)) is not None:
        if isinstance(msg, m.Open):
            opened.add(msg.rid)
        elif isinstance(msg, m.Close):
            opened.discard(msg.rid)
        elif isinstance(msg, m.Step):
            entries = [
                m.DraftEntry(rid, "cache", D, True)
                if rid in opened
                else m.DraftEntry(rid, "missing", 0, False)
                for rid in msg.requests
            ]
            drafts = m.Drafts(step_id=msg.step_id, entries=entries, max_depth=D, vocab_size=V)
            tokens = torch.full((len(entries), D), -1, dtype=torch.int64)
            rows = [i for i, entry in enumerate(entries) if entry.has_q]
            tokens[rows] = msg.step_id
            q = torch.empty(len(rows), D, V)
            for i in range(len(rows)):
                q[i].fill_(_fill(msg.step_id, i))
            send_s.append(link.send_drafts(drafts, tokens, q if rows else None))
        elif isinstance(msg, m.StatsRequest):
            stats = m.SpeculatorStats(steps=len(send_s), send_s=sum(send_s))
            link.send(m.StatsReply(stats=stats))
        elif isinstance(msg, m.Shutdown):
            break
    link.close()


def bad_version_main(address_json: str) -> None:
    """Child process: handshake with the wrong protocol version; exit 0 iff it is refused."""
    address = LinkAddress.from_json(address_json)
    with ControlEndpoint.connect(address.control) as control:
        try:
            control.handshake(address.session, 20.0, version=PROTOCOL_VERSION + 1)
        except wire.TransportError as err:
            raise SystemExit(0 if "version mismatch" in str(err) else 2) from None
    raise SystemExit(1)


def _spawn(fn, address: LinkAddress) -> mp.Process:
    proc = mp.get_context("spawn").Process(target=fn, args=(address.to_json(),), daemon=True)
    proc.start()
    return proc


@pytest.fixture(scope="module")
def children():
    """Both children start together, so their imports (seconds each) overlap."""
    links = {"good": TargetLink(tensor_timeout_s=20.0), "bad": TargetLink()}
    addresses = {name: link.start() for name, link in links.items()}
    procs = {
        "good": _spawn(speculator_main, addresses["good"]),
        "bad": _spawn(bad_version_main, addresses["bad"]),
    }
    yield {name: (links[name], procs[name]) for name in links}
    for name, link in links.items():
        link.close()
        procs[name].join(20.0)
        if procs[name].is_alive():  # never leave an orphan behind
            procs[name].kill()


def test_two_process_rounds_with_full_vocabulary_q(children) -> None:
    target, proc = children["good"]
    hello = target.accept(25.0)
    assert hello.pid == proc.pid
    for rid in ("a", "b", "c", "d"):
        sampling = m.SamplingSpec(temperature=0.7, top_k=-1, top_p=1.0, seed=1)
        target.send(m.Open(rid=rid, token_ids=[1, 2, 3], sampling=sampling))
    recv_s = []
    for step_id in range(1, 6):
        requests = ["a", "b", "c", "d"] + (["ghost"] if step_id == 3 else [])
        target.send_step(m.Step(step_id=step_id, outcomes=[], requests=requests, backup="jit"))
        drafts, tokens, q, _ = target.recv_drafts(step_id, 20.0)
        recv_s.append(target.tensors.received.last_s)
        assert [e.source for e in drafts.entries][-1] == ("missing" if step_id == 3 else "cache")
        assert q.shape == (4, D, V) and q.dtype == torch.float32
        assert (tokens[:4] == step_id).all() and (tokens[4:] == -1).all()
        for row in range(4):
            assert torch.all(q[row] == _fill(step_id, row))
    target.send(m.Close(rid="a"))
    target.send_step(m.Step(step_id=6, outcomes=[], requests=["a"], backup="ngram"))
    assert target.recv_drafts(6, 20.0).q is None
    target.send(m.StatsRequest())
    stats = target.recv_reply(m.StatsReply, 20.0).stats
    send_s = stats.send_s / stats.steps
    print(
        f"\n[4, 4, {V}] float32 over gloo: speculator send mean {send_s * 1e3:.1f} ms, "
        f"target recv median {statistics.median(recv_s) * 1e3:.1f} ms"
    )
    address = target.address
    target.close()  # sends Shutdown: the child exits on its own
    proc.join(20.0)
    assert proc.exitcode == 0
    with ControlEndpoint.bind(address.control):  # the port is free again
        pass


def test_two_process_version_mismatch_is_refused(children) -> None:
    target, proc = children["bad"]
    with pytest.raises(wire.TransportError, match="version mismatch"):
        target.accept(25.0)
    proc.join(20.0)
    assert proc.exitcode == 0

"""Link faults without an SGLang server: the real `SpeculatorClient`, the real
speculator entry point (`python -m sglang_ssd.speculator`'s `main`) on a tiny draft model, and the
real link, with the speculator "process" run as a thread of the test.

Covered: the speculator closing its socket and exiting, a speculator that stops answering, a
speculator restarting with another protocol version (refused and logged on both sides), the target
vanishing mid-transfer (and, as a real process, dying), and messages that arrive after their
request was closed (a stale Outcome, a Step naming a closed request). Each is handled and logged;
neither side raises. Also which requests the client opens at prefill.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import psutil
import pytest
import torch

import sglang_ssd.launch.placement as placement_module
import sglang_ssd.worker.supervisor as supervisor_module
from sglang_ssd.config import DEFAULT_DRAFT_KV_TOKENS, SSDConfig, SSDConfigError
from sglang_ssd.launch.placement import Placement
from sglang_ssd.speculator import __main__ as speculator_main
from sglang_ssd.speculator.server import SpeculatorServer
from sglang_ssd.transport import (
    PROTOCOL_VERSION,
    Close,
    Configure,
    ControlEndpoint,
    LinkAddress,
    LiveSettings,
    Open,
    Outcome,
    SamplingSpec,
    Shutdown,
    Step,
    TargetLink,
)
from sglang_ssd.worker.planner import RoundPlanner
from sglang_ssd.worker.speculator_admin import SpeculatorAdmin, speculator_config
from sglang_ssd.worker.speculator_client import SpeculatorClient

V = 128  # the tiny models' vocabulary
TIMEOUT_S = 3.0  # --ssd-speculator-timeout (generous: the first rounds warm up)
GREEDY = SimpleNamespace(
    temperature=0.0, top_k=1, top_p=1.0, sampling_seed=None, max_new_tokens=None
)


@dataclass
class Req:
    """The parts of SGLang's `Req` the client reads."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    sampling_params: Any = field(default_factory=lambda: GREEDY)


class ThreadSpeculator:
    """Stands in for `SpeculatorProcess`: runs the speculator's real `main` on a thread.

    `hang` makes its next Step block (as if SIGSTOPped) until `kill`; `proc.returncode` is
    `main`'s return value once the thread ends.
    """

    started: ClassVar[list[ThreadSpeculator]] = []
    version: ClassVar[int] = PROTOCOL_VERSION  # the protocol version the next speculators speak

    def __init__(
        self,
        config: SSDConfig,
        model_path: str,
        address: LinkAddress,
        placement: Placement,
        target_vocab_size: int | None = None,
        target_model_path: str | None = None,
    ) -> None:
        self.pid = 1_000_000 + len(self.started)
        self.proc = SimpleNamespace(returncode=None)
        self.killed = threading.Event()
        self.hang = threading.Event()
        self.version = ThreadSpeculator.version
        argv = [
            "--address", address.to_json(),
            "--model-path", str(model_path),
            "--config", config.to_json(),
            "--device", "cpu",
            "--dtype", "float32",
            "--kv-slots", "4096",
            "--parent-pid", str(os.getppid()),
        ]  # fmt: skip
        if target_vocab_size is not None:
            argv += ["--target-vocab-size", str(target_vocab_size)]
        self.thread = threading.Thread(target=self._run, args=(argv,), daemon=True)
        self.started.append(self)
        self.thread.start()

    def _run(self, argv: list[str]) -> None:
        local.speculator = self
        with contextlib.suppress(SystemExit):  # `hanging_step`'s stand-in for SIGKILL
            self.proc.returncode = speculator_main.main(argv)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def cpu_seconds(self) -> float:
        """Progress as `SpeculatorProcess.cpu_seconds` measures it: none while hung."""
        return 0.0 if self.hang.is_set() else time.monotonic()

    def kill(self) -> None:
        self.killed.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.kill()


local = threading.local()  # which ThreadSpeculator the current thread runs


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Thread speculators, no CPU pinning of the test process, fast restarts; the speculator's
    handshake speaks `ThreadSpeculator.version` and its Step honours `hang`."""
    monkeypatch.setattr(supervisor_module, "SpeculatorProcess", ThreadSpeculator)
    monkeypatch.setattr(placement_module, "pin_process", lambda cpus: list(cpus))
    monkeypatch.setattr(supervisor_module, "RESTART_BACKOFF_S", 0.05)
    monkeypatch.setattr(supervisor_module, "ACCEPT_POLL_S", 0.2)
    handshake, step = ControlEndpoint.handshake, SpeculatorServer._step

    def speculator_handshake(self, session, timeout_s, version=PROTOCOL_VERSION, **kw):
        me = getattr(local, "speculator", None)
        if self.side == "speculator" and me is not None:
            version = me.version
        return handshake(self, session, timeout_s, version, **kw)

    def hanging_step(self, msg):
        me = local.speculator
        if me.hang.is_set():
            me.killed.wait()
            if me.killed.is_set():  # a killed process would not go on
                raise SystemExit(137)
        return step(self, msg)

    monkeypatch.setattr(ControlEndpoint, "handshake", speculator_handshake)
    monkeypatch.setattr(SpeculatorServer, "_step", hanging_step)
    ThreadSpeculator.started = []
    ThreadSpeculator.version = PROTOCOL_VERSION
    yield
    for speculator in ThreadSpeculator.started:
        speculator.kill()


CONFIG = SSDConfig(lookahead=4, fanout_budget=4, speculator_timeout=TIMEOUT_S, backup="jit")


@pytest.fixture
def client(patched: None, tiny_draft: Path) -> Iterator[SpeculatorClient]:
    made = SpeculatorClient(speculator_config(CONFIG, None), str(tiny_draft), "cpu", V)
    yield made
    made.shutdown()


@pytest.fixture
def planner() -> RoundPlanner:
    return RoundPlanner(CONFIG)


@pytest.fixture
def admin(client: SpeculatorClient, planner: RoundPlanner) -> SpeculatorAdmin:
    """Wired as `SSDWorker.alloc_memory_pool` wires it (no target capacity here)."""
    return SpeculatorAdmin(client, on_configure=planner.apply)


def decode_round(client: SpeculatorClient, planner: RoundPlanner, reqs: list[Req]) -> list[str]:
    """One decode round as `SSDWorker` runs it (accept the first draft token, bonus 5);
    returns the draft sources."""
    batch = client.drafts(reqs, planner)
    accept = [min(1, int(d)) for d in batch.depth]
    for req, k, row in zip(reqs, accept, batch.tokens.tolist(), strict=True):
        req.output_ids += [*row[:k], 5]
    client.record_outcomes([r.rid for r in reqs], accept, [5] * len(reqs))
    return batch.sources


def prefill(client: SpeculatorClient, tag: str, n: int = 2) -> list[Req]:
    """``n`` new requests through prefill as `SSDWorker` runs it: `prepare`, then the target
    samples each request's first token."""
    reqs = [Req(f"{tag}{i}", [40 + i, 71, 72, 73, 0, 5, 9]) for i in range(n)]
    client.prepare(reqs)
    for req in reqs:
        req.output_ids.append(9)
    return reqs


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def assert_back_to_ssd(client: SpeculatorClient, planner: RoundPlanner, restarts: int) -> None:
    wait_until(lambda: client.supervisor.restarts >= restarts and client.link is not None)
    reqs = prefill(client, f"after{restarts}-")
    sources = [decode_round(client, planner, reqs) for _ in range(3)]
    assert all(s in ("jit", "cache") for round_ in sources for s in round_), sources


def test_speculator_exit_is_a_fault_served_locally_then_restarted(client, planner, caplog) -> None:
    caplog.set_level(logging.INFO)
    reqs = prefill(client, "a")
    assert set(decode_round(client, planner, reqs)) <= {"jit", "cache"}
    first = ThreadSpeculator.started[0]
    client.link.send(Shutdown())  # the speculator closes its socket and exits
    first.thread.join(10)
    assert first.proc.returncode == 0
    assert decode_round(client, planner, reqs) == ["local-ngram"] * 2
    assert client.supervisor.faults == 1
    assert "exited with code 0" in caplog.text
    assert_back_to_ssd(client, planner, restarts=1)
    assert decode_round(
        client, planner, reqs
    )  # the old requests are reopened on the new speculator


def test_a_hung_speculator_costs_one_timeout(client, planner, caplog) -> None:
    reqs = prefill(client, "h")
    decode_round(client, planner, reqs)
    hung = ThreadSpeculator.started[0]
    hung.hang.set()
    start = time.monotonic()
    assert decode_round(client, planner, reqs) == ["local-ngram"] * 2
    assert TIMEOUT_S <= time.monotonic() - start < TIMEOUT_S + 2.0
    assert hung.killed.is_set() and client.supervisor.faults == 1
    assert f"no drafts within {TIMEOUT_S} s" in caplog.text
    hung.thread.join(10)
    assert not hung.alive()
    assert_back_to_ssd(client, planner, restarts=1)


def test_restart_with_another_protocol_version_is_refused_on_both_sides(
    client, planner, caplog
) -> None:
    caplog.set_level(logging.INFO)
    reqs = prefill(client, "v")
    decode_round(client, planner, reqs)
    ThreadSpeculator.version = PROTOCOL_VERSION + 1  # what the restarted speculator speaks
    client.link.send(Shutdown())
    ThreadSpeculator.started[0].thread.join(10)
    assert decode_round(client, planner, reqs) == ["local-ngram"] * 2
    wait_until(lambda: len(ThreadSpeculator.started) >= 3)  # two refused restarts
    refused = ThreadSpeculator.started[1]
    refused.thread.join(10)
    assert refused.proc.returncode == speculator_main.EXIT_LINK_REFUSED
    target_side = "speculator restart failed (speculator handshake rejected: protocol version"
    speculator_side = "cannot link to the target: target rejected the handshake: protocol version"
    assert target_side in caplog.text and speculator_side in caplog.text
    assert client.supervisor.restarts == 0 and client.link is None
    assert decode_round(client, planner, reqs) == ["local-ngram"] * 2  # still serving meanwhile
    ThreadSpeculator.version = PROTOCOL_VERSION
    wait_until(
        lambda: client.supervisor.restarts == 1, timeout_s=120
    )  # the backoff has grown to ~6 s
    assert_back_to_ssd(client, planner, restarts=1)


def test_stale_outcome_and_closed_requests_are_logged_not_fatal(
    client, planner, admin, caplog
) -> None:
    reqs = prefill(client, "s", 3)
    decode_round(client, planner, reqs)
    client.close("s0")  # finished or aborted while its outcome was still to be reported
    client.record_outcomes(["s0"], [0], [5])  # a stale outcome: dropped, never sent
    assert "s0" not in client.pending
    assert set(decode_round(client, planner, reqs[1:])) <= {"jit", "cache"}

    # The same on the wire: a Step that names a closed request and carries its outcome.
    link = client.link
    sampling = SamplingSpec(temperature=0.0, top_k=1, top_p=1.0)
    link.send(Open(rid="x", token_ids=[1, 2, 3], sampling=sampling))
    link.send(Close(rid="x"))
    link.send(Close(rid="never-opened"))
    client.step_id += 1
    outcome = Outcome(rid="x", accept_len=1, bonus=4)
    link.send_step(Step(step_id=client.step_id, outcomes=[outcome], requests=["x"], backup="jit"))
    got = link.recv_drafts(client.step_id, 10.0)
    assert [e.source for e in got.drafts.entries] == ["missing"]
    assert "cannot apply outcome" in caplog.text
    assert client.supervisor.faults == 0
    assert set(decode_round(client, planner, reqs[1:])) <= {"jit", "cache"}  # serving goes on
    client.close("s1")
    client.close("s2")
    stats = admin.stats().speculator
    assert stats.open_requests == 0 and stats.kv_slots_used == 0 and stats.cache_entries == 0


def test_a_request_that_ends_at_prefill_is_never_opened(
    client: SpeculatorClient, admin: SpeculatorAdmin
) -> None:
    """SGLang prefills the shared prefix of an `n > 1` request as a copy with
    `max_new_tokens` 0 (and a 1-token request ends at prefill too): nothing to draft, so the
    speculator neither prefills nor pre-speculates it."""
    limits = {"warmup": 0, "one": 1, "many": 8, "open-ended": None}
    reqs = [
        Req(
            rid,
            [40, 71, 72, 73],
            sampling_params=SimpleNamespace(**{**vars(GREEDY), "max_new_tokens": n}),
        )
        for rid, n in limits.items()
    ]
    client.prepare(reqs)
    assert set(client.opened) == {"many", "open-ended"}
    assert set(client.last_seen) == {"many", "open-ended"}
    wait_until(lambda: admin.stats().speculator.open_requests == 2)


def test_configure_refuses_fanout_the_speculator_cannot_hold(
    client: SpeculatorClient, admin: SpeculatorAdmin
) -> None:
    before = client.config
    assert before.draft_kv_tokens == DEFAULT_DRAFT_KV_TOKENS  # no target capacity here
    # V = 128: one round has (γ + 1)(V − 1) = 635 outcomes to spend a budget on.
    with pytest.raises(SSDConfigError, match="--ssd-fanout-budget must be at most 635"):
        admin.configure(Configure(changes=LiveSettings(fanout_budget=1000)))
    assert client.config == before
    ack = admin.configure(Configure(changes=LiveSettings(fanout_budget=16)))
    assert ack is not None and ack.applied.fanout_budget == 16
    assert admin.stats().client.draft_kv_tokens == DEFAULT_DRAFT_KV_TOKENS


def test_plain_rounds_are_refused_live_off_the_cpu(
    client: SpeculatorClient, planner: RoundPlanner, admin: SpeculatorAdmin
) -> None:
    """`POST /ssd/config {"mode": "plain"}` on a CUDA target: refused (400 through the admin
    bridge), nothing changed (`round_mode.mode_refusal` says why)."""
    client.target_device = torch.device("cuda", 0)  # no GPU needed: refused before any use
    before, offered = client.config, planner.arrangements.offered
    with pytest.raises(SSDConfigError, match="--ssd-mode plain is not supported"):
        admin.configure(Configure(changes=LiveSettings(mode="plain")))
    assert client.config == before and planner.arrangements.offered == offered
    ack = admin.configure(Configure(changes=LiveSettings(beta=0.5)))
    assert ack is not None and client.config.beta == 0.5


def test_target_vanishing_mid_transfer_ends_the_speculator_cleanly(
    patched: None, tiny_draft: Path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    target = TargetLink(tensor_timeout_s=5.0)
    address = target.start()
    config = SSDConfig(lookahead=4, fanout_budget=4)
    speculator = ThreadSpeculator(config, str(tiny_draft), address, Placement("cpu", None))
    target.accept(60.0)
    sampling = SamplingSpec(temperature=0.7, top_k=-1, top_p=1.0, seed=1)
    target.send(Open(rid="r", token_ids=[1, 2, 3, 4], sampling=sampling))
    target.send_step(Step(step_id=1, outcomes=[], requests=["r"], backup="jit"))
    target._control.close()  # the target dies: no Shutdown, no reply collected
    target._tensors.close()
    speculator.thread.join(30)
    assert not speculator.alive()
    assert speculator.proc.returncode == 0  # `main` returned: no exception escaped
    assert "SSD speculator: link failed" in caplog.text
    target.close()


def test_speculator_exits_when_its_parent_dies(tmp_path: Path) -> None:
    """`watch_parent` ends the speculator once the target's process is gone (even mid-load)."""
    child = (
        "import os, time\n"
        "from sglang_ssd.speculator.__main__ import watch_parent\n"
        "watch_parent(os.getppid(), poll_s=0.1)\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(600)\n"  # stands for loading, a forward or a blocked transfer
    )
    parent = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "time.sleep(600)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    ) as target:
        assert target.stdout is not None
        speculator = int(target.stdout.readline())
        target.kill()
        target.wait()
        deadline = time.monotonic() + 10
        while psutil.pid_exists(speculator) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(speculator), "the speculator outlived its parent"

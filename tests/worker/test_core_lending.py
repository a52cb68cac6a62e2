"""Moving cores between the target and the speculator (`core_lending`): a sync or plain round's
verify on every core with the speculator stopped (a real stopped child process), a sync round's
draft on every core in the speculator (`SpeculatorServer._cores`), each read back from /proc
while the block runs; and how a plain round's tokens reach the speculator (`outcome_since`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from sglang_ssd.speculator.server import SpeculatorServer
from sglang_ssd.worker.core_lending import CoreLending, omp_wait_problem
from sglang_ssd.worker.request_messages import outcome_since

TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")


def test_outcome_since_carries_plain_round_tokens_as_extra():
    tokens = [5, 6, 7, 8, 9, 10]  # the speculator holds 3; then k = 1 of [8, ...], bonus 9
    got = outcome_since("r", tokens, 3, (1, 9))
    assert (got.accept_len, got.bonus, got.extra) == (1, 9, [10])
    assert outcome_since("r", tokens[:5], 3, (1, 9)).extra == []
    # No verified round reported since (a new request, plain rounds only): k = 0.
    got = outcome_since("r", tokens, 3, None)
    assert (got.accept_len, got.bonus, got.extra) == (0, 8, [9, 10])
    assert outcome_since("r", tokens, 3, (1, 4)) is None  # not the reported bonus: re-open
    assert outcome_since("r", tokens, 6, None) is None  # nothing new
    assert outcome_since("r", tokens, None, None) is None  # unknown to the speculator


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _thread_cpus(pid: int) -> set[tuple[int, ...]]:
    """Each thread's allowed cores as /proc/<pid>/task/*/status lists them (Cpus_allowed_list)."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            line = next(x for x in f if x.startswith("Cpus_allowed_list:"))
        cpus: list[int] = []
        for part in line.split(":", 1)[1].strip().split(","):
            lo, _, hi = part.partition("-")
            cpus += range(int(lo), int(hi or lo) + 1)
        found.add(tuple(cpus))
    return found


@TWO_CORES
def test_lent_cores_stop_the_speculator_and_widen_every_target_thread():
    cpus = sorted(os.sched_getaffinity(0))
    before, threads = cpus, torch.get_num_threads()
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        lending = CoreLending(cpus[:1], cpus[1:2])
        assert lending.sync_draft_cpus == cpus[:2]
        os.sched_setaffinity(0, cpus[:1])
        with lending.lent(child.pid):
            time.sleep(0.05)
            assert _state(child.pid) == "T"  # stopped
            assert _thread_cpus(os.getpid()) == {tuple(cpus[:2])}  # every thread widened
            assert torch.get_num_threads() == 2
        assert _state(child.pid) != "T"  # running again
        assert _thread_cpus(os.getpid()) == {tuple(cpus[:1])} and torch.get_num_threads() == 1
        with pytest.raises(RuntimeError), lending.lent(child.pid):
            raise RuntimeError("forward failed")
        assert _state(child.pid) != "T" and lending.lends == 2
        with lending.lent(None):  # the speculator is down: only the cores move
            assert sorted(os.sched_getaffinity(0)) == cpus[:2]
    finally:
        child.kill()
        child.wait()
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
    gpu = CoreLending([], [1])  # GPU placement: nothing to lend, nothing to widen
    assert gpu.sync_draft_cpus == [] and not gpu.enabled
    with gpu.lent(12345):
        pass


@TWO_CORES
def test_a_sync_rounds_draft_runs_on_every_core_in_the_speculator():
    """The Step's `draft_cpus` widen every speculator thread for the draft, then pin back."""
    cpus = sorted(os.sched_getaffinity(0))
    before, threads = cpus, torch.get_num_threads()
    server = object.__new__(SpeculatorServer)  # only its core handling, no link or engine
    try:
        os.sched_setaffinity(0, cpus[:1])
        torch.set_num_threads(1)
        server.own_cpus = cpus[:1]
        with server._cores(cpus[:2]):
            assert _thread_cpus(os.getpid()) == {tuple(cpus[:2])}
            assert torch.get_num_threads() == 2
        assert _thread_cpus(os.getpid()) == {tuple(cpus[:1])} and torch.get_num_threads() == 1
        with server._cores([]):  # an async round: its own cores
            assert _thread_cpus(os.getpid()) == {tuple(cpus[:1])}
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


def test_an_active_openmp_wait_policy_is_reported():
    assert omp_wait_problem({}) is None and omp_wait_problem({"OMP_WAIT_POLICY": "passive"}) is None
    assert "spin" in (omp_wait_problem({"OMP_WAIT_POLICY": "ACTIVE"}) or "")

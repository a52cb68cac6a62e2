"""Plain rounds on the target side: when they are chosen (`RoundModePolicy`), how their tokens
reach the speculator (`outcome_since`), and how the speculator's cores are lent
(`CoreLending`, with a real stopped child process)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import pytest

from sglang_ssd.worker.core_lending import CoreLending
from sglang_ssd.worker.round_mode import RoundMode, RoundModePolicy
from sglang_ssd.worker.speculator_client import outcome_since

SPEC, PLAIN = RoundMode.SPECULATE, RoundMode.PLAIN


def _drive(policy: RoundModePolicy, rounds: int, spec_s: float, tokens: float, plain_s: float):
    """Run `rounds` rounds at batch size 1 with fixed round times; the modes chosen."""
    modes = []
    for _ in range(rounds):
        mode = policy.choose(1, [100])
        modes.append(mode)
        if mode == SPEC:
            policy.observe(mode, 1, spec_s, tokens)
        else:
            policy.observe(mode, 1, plain_s, 1.0)
    return modes


def test_slow_speculation_turns_plain_and_keeps_probing_with_backoff():
    """2 tokens per 0.5 s speculating (4 tok/s) against 1 per 0.2 s plain (5 tok/s)."""
    policy = RoundModePolicy(backoff_min=8, backoff_max=64)
    modes = _drive(policy, 400, spec_s=0.5, tokens=2.0, plain_s=0.2)
    assert modes[:6] == [SPEC] * 6  # warm-up, then the first probe of plain rounds
    assert modes[6:9] == [PLAIN] * 3
    tail = modes[150:]
    assert tail.count(PLAIN) > 0.85 * len(tail)
    starts = [i for i in range(1, len(tail)) if tail[i] == SPEC and tail[i - 1] == PLAIN]
    assert starts and min(b - a for a, b in itertools.pairwise(starts)) >= 64
    assert all(tail[i : i + 8] == [SPEC] * 8 for i in starts if i + 8 <= len(tail))
    assert policy.rate(PLAIN, 1) == pytest.approx(5.0)
    assert policy.rate(SPEC, 1) == pytest.approx(4.0)


def test_fast_speculation_stays_and_a_traffic_change_is_noticed():
    policy = RoundModePolicy(backoff_min=8, backoff_max=32)
    modes = _drive(policy, 100, spec_s=0.5, tokens=4.0, plain_s=0.2)
    assert modes[60:].count(SPEC) >= 0.8 * 40
    # Chat-like traffic now: acceptance falls; a probe-free stretch of speculative rounds
    # measures it and the policy turns plain.
    modes = _drive(policy, 60, spec_s=0.5, tokens=1.5, plain_s=0.2)
    assert modes[-10:] == [PLAIN] * 10
    assert policy.plain_now  # prefills now borrow the speculator's cores too
    # A new request arrives: speculation is probed at once, and a code-like request (fast
    # speculation) takes it back.
    policy.note_arrival()
    modes = _drive(policy, 12, spec_s=0.5, tokens=4.0, plain_s=0.2)
    assert modes[:8] == [SPEC] * 8 and modes[-4:] == [SPEC] * 4 and not policy.plain_now


def test_one_token_left_is_plain_and_settings_force_a_mode():
    policy = RoundModePolicy()
    assert policy.choose(2, [1, 1]) == PLAIN
    assert policy.choose(2, [1, 5]) == SPEC
    assert RoundModePolicy("never").choose(1, [1]) == SPEC
    assert RoundModePolicy("always").choose(1, [50]) == PLAIN
    assert RoundModePolicy("always").plain_now and not RoundModePolicy("never").plain_now
    assert not policy.plain_now  # a one-token round is plain, but not the mode in use
    with pytest.raises(ValueError, match="setting"):
        RoundModePolicy("sometimes")
    with pytest.raises(ValueError, match="batch_size"):
        policy.choose(0, [])
    with pytest.raises(ValueError, match="tokens_per_request"):
        policy.observe(SPEC, 1, 0.1, 0.5)


def test_the_rounds_after_a_switch_are_not_measured():
    policy = RoundModePolicy()
    policy.observe(SPEC, 1, 0.5, 3.0)  # the first round: skipped like a switch
    policy.observe(SPEC, 1, 0.5, 3.0)
    policy.observe(SPEC, 1, 0.5, 3.0)
    assert policy.rate(SPEC, 1) == pytest.approx(6.0)
    policy.observe(PLAIN, 1, 9.0, 1.0)  # pays the switch: skipped
    assert policy.rate(PLAIN, 1) is None
    policy.observe(PLAIN, 1, 0.25, 1.0)
    assert policy.rate(PLAIN, 1) == pytest.approx(4.0)
    assert policy.rate(PLAIN, 4) == pytest.approx(4.0)  # the nearest measured batch size
    policy.observe(SPEC, 1, 5.0, 1.0)  # a cold cache after plain rounds: two skipped
    policy.observe(SPEC, 1, 5.0, 1.0)
    assert policy.rate(SPEC, 1) == pytest.approx(6.0)


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


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to lend one")
def test_lent_cores_stop_the_speculator_and_widen_the_target():
    cpus = sorted(os.sched_getaffinity(0))
    before = cpus
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        lending = CoreLending(cpus[:1], cpus[1:2])
        os.sched_setaffinity(0, cpus[:1])
        with lending.lent(child.pid):
            time.sleep(0.05)
            assert _state(child.pid) == "T"  # stopped
            assert sorted(os.sched_getaffinity(0)) == cpus[:2]
        assert _state(child.pid) != "T"  # running again
        assert sorted(os.sched_getaffinity(0)) == cpus[:1]
        with pytest.raises(RuntimeError), lending.lent(child.pid):
            raise RuntimeError("forward failed")
        assert _state(child.pid) != "T" and lending.lends == 2
        with lending.lent(None):  # the speculator is down: only the cores move
            assert sorted(os.sched_getaffinity(0)) == cpus[:2]
    finally:
        child.kill()
        child.wait()
        os.sched_setaffinity(0, before)
    with CoreLending([], [1]).lent(12345):  # GPU placement: nothing to lend
        pass

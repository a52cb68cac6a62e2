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
from sglang_ssd.worker.probes import ProbeSchedule
from sglang_ssd.worker.request_messages import outcome_since
from sglang_ssd.worker.round_mode import (
    MIN_REQUEST_ROUNDS,
    RoundMode,
    RoundModePolicy,
    record_request_tokens,
    request_accept_length,
)

SPEC, PLAIN = RoundMode.SPECULATE, RoundMode.PLAIN


def _drive(policy: RoundModePolicy, rounds: int, spec_s: float, plain_s: float, length: float):
    """`rounds` rounds of one request whose L_r is `length`, at fixed round times; the modes."""
    modes = []
    for _ in range(rounds):
        mode = policy.choose([100], [length])
        modes.append(mode)
        policy.observe(mode, 1, spec_s if mode == SPEC else plain_s)
    return modes


def test_slow_speculation_turns_plain_and_probes_with_backoff():
    """L 1.8 per 0.5 s speculating (3.6 tok/s) against 1 per 0.2 s plain (5 tok/s)."""
    policy = RoundModePolicy(probes=ProbeSchedule(backoff_min=8, backoff_max=64), margin=1.05)
    modes = _drive(policy, 400, spec_s=0.5, plain_s=0.2, length=1.8)
    # Speculation is measured at b = 1, then one plain round, and speculation loses.
    assert modes[:3] == [SPEC, PLAIN, PLAIN]
    tail = modes[150:]
    assert tail.count(PLAIN) > 0.9 * len(tail)
    starts = [i for i in range(1, len(tail)) if tail[i] == SPEC and tail[i - 1] == PLAIN]
    assert starts and min(b - a for a, b in itertools.pairwise(starts)) >= 64
    assert all(tail[i : i + 4] == [SPEC] * 4 for i in starts if i + 4 <= len(tail))
    assert policy.rate(PLAIN, 1) == pytest.approx(5.0)
    assert policy.rate(SPEC, 1, 1.8) == pytest.approx(3.6)
    assert policy.plain_now  # prefills now borrow the speculator's cores too


def test_fast_speculation_stays_and_each_request_brings_its_accept_length():
    policy = RoundModePolicy(margin=1.05)
    assert _drive(policy, 50, spec_s=0.5, plain_s=0.2, length=4.0) == [SPEC, PLAIN] + [SPEC] * 48
    # A chat-like request (L 1.5) alone: plain; with a code-like one (mean L 2.75 > 2.5): not.
    assert policy.choose([100], [1.5]) == PLAIN
    policy.observe(PLAIN, 1, 0.2)
    assert policy.choose([100, 100], [1.5, 4.0]) == SPEC
    assert policy.choose([100, 100], [1.5, None]) == SPEC  # a newcomer is measured first
    assert not policy.plain_now
    # Per batch size: plain rounds at b = 4 are measured apart from b = 1.
    policy.observe(SPEC, 4, 0.6)
    policy.observe(PLAIN, 4, 0.3)
    assert policy.rate(SPEC, 4, 2.0) == pytest.approx(2.0 / 0.6)
    assert policy.rate(PLAIN, 3) == pytest.approx(1 / 0.3)  # the nearest measured size


def test_newcomers_count_with_the_recent_accept_length_at_their_batch_size():
    """Rounds measured as on the 2-core EPYC at b = 4 (speculative 0.9 s, plain 0.27 s): a
    batch of newcomers is judged at once by L(4), and a batch size with no plain round measured
    within a factor 2 runs one plain round to measure it."""
    policy = RoundModePolicy()
    newcomers = [None] * 4
    assert policy.choose([100] * 4, newcomers) == SPEC  # fresh server: measure speculation
    policy.observe(SPEC, 4, 0.9)
    policy.observe_accept(4, 1.6)  # chat-like rounds
    assert policy.choose([100] * 4, newcomers) == PLAIN  # t_plain(4) unmeasured: measure it
    policy.observe(PLAIN, 4, 0.27)
    assert policy.choose([100] * 4, newcomers) == PLAIN  # 1.6 / 0.9 against 1 / 0.27
    assert policy.plain_now
    code = RoundModePolicy()
    code.observe(SPEC, 4, 0.9)
    code.observe(PLAIN, 4, 0.27)
    code.observe_accept(4, 4.5)
    assert code.choose([100] * 4, newcomers) == SPEC  # 4.5 / 0.9 against 1 / 0.27
    assert code.choose([100] * 8, [None] * 8) == SPEC  # b = 8: t_plain(4) is near enough
    assert code.choose([100] * 16, [None] * 16) == SPEC  # b = 16 is not: measure both
    code.observe(SPEC, 16, 2.0)
    assert code.choose([100] * 16, [None] * 16) == PLAIN
    code.observe(PLAIN, 16, 0.6)
    assert (
        code.choose([100] * 16, [None] * 16) == SPEC
    )  # nearest L(4) and t_spec(4): 4.5 / 0.9 against 1 / 0.6
    with pytest.raises(ValueError, match="mean_tokens"):
        code.observe_accept(4, 0.5)


def test_probes_take_at_most_their_share_of_the_plain_rounds_time():
    """At b = 4 on the 2-core EPYC a speculative round (0.9 s) costs 3.3 plain ones (0.27 s):
    4-round probes come after at least 4 x 0.9 / (0.2 x 0.27) = 67 plain rounds, not 16."""
    policy = RoundModePolicy()
    policy.observe(SPEC, 4, 0.9)
    policy.observe(PLAIN, 4, 0.27)
    policy.observe_accept(4, 1.6)
    modes = [policy.choose([100] * 4, [None] * 4) for _ in range(100)]
    assert modes[:67] == [PLAIN] * 67
    assert modes[67:71] == [SPEC] * 4


def test_the_default_margin_keeps_speculating_when_plain_is_only_a_little_faster():
    policy = RoundModePolicy()
    _drive(policy, 3, spec_s=0.5, plain_s=0.2, length=2.2)
    policy.observe(PLAIN, 1, 0.2)  # plain measured: 5 tok/s against 4.4
    assert policy.choose([100], [2.2]) == SPEC
    assert policy.choose([100], [1.5]) == PLAIN  # 5 against 3: worth a switch


def test_one_token_left_is_plain_and_settings_force_a_mode():
    policy = RoundModePolicy()
    assert policy.choose([1, 1], [None, None]) == PLAIN
    assert policy.choose([1, 5], [None, None]) == SPEC
    assert RoundModePolicy("never").choose([1], [None]) == SPEC
    assert RoundModePolicy("always").choose([50], [4.0]) == PLAIN
    assert RoundModePolicy("always").plain_now and not RoundModePolicy("never").plain_now
    assert not policy.plain_now  # a one-token round is plain, but not the mode in use
    with pytest.raises(ValueError, match="setting"):
        RoundModePolicy("sometimes")
    with pytest.raises(ValueError, match="one tokens_left"):
        policy.choose([], [])
    with pytest.raises(ValueError, match="round_s"):
        policy.observe(SPEC, 1, 0.0)


def test_request_accept_length_needs_some_rounds_and_follows_recent_ones():
    class Req:
        pass

    req = Req()
    assert request_accept_length(req) is None
    for _ in range(MIN_REQUEST_ROUNDS - 1):
        record_request_tokens(req, 5)
    assert request_accept_length(req) is None
    record_request_tokens(req, 1)
    assert request_accept_length(req) == pytest.approx(0.7 * 5 + 0.3 * 1)


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

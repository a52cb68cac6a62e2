"""`SyncRoundPolicy` (`--ssd-sync-rounds`): which kind of speculative round runs, pre-speculated
(async) or drafted just in time with the speculator's cores lent (sync), from measured rates."""

from __future__ import annotations

import itertools

import pytest

from sglang_ssd.worker.probes import ProbeSchedule
from sglang_ssd.worker.sync_rounds import ASYNC, SYNC, SyncRoundPolicy

# Measured on the 2-core AMX Xeon at batch 1 (eval/results/ssd-bench-equal-b1-greedy-xeon-amx.json):
# SSD's rounds 0.59 s for 2.81 tokens, synchronous SD's 0.56 s for 3.33 (the verify on 2 cores).
ASYNC_ROUND = (0.59, 2.81)
SYNC_ROUND = (0.56, 3.33)


def run(policy: SyncRoundPolicy, rounds: int, batch_size: int = 1) -> list[bool]:
    """`rounds` choices, each measured with the AMX figures of its kind."""
    kinds = []
    for _ in range(rounds):
        kind = policy.choose(batch_size)
        seconds, tokens = SYNC_ROUND if kind else ASYNC_ROUND
        policy.observe(kind, batch_size, seconds, tokens)
        kinds.append(kind)
    return kinds


@pytest.mark.parametrize(("setting", "kind"), [("never", ASYNC), ("always", SYNC)])
def test_fixed_settings_never_measure_to_choose(setting: str, kind: bool) -> None:
    policy = SyncRoundPolicy(setting)
    assert run(policy, 40) == [kind] * 40
    assert policy.sync_now == (kind == SYNC)
    assert policy.stats()["sync_rounds"] == (40 if kind == SYNC else 0)


def test_auto_measures_both_kinds_then_keeps_the_faster() -> None:
    policy = SyncRoundPolicy("auto")
    kinds = run(policy, 3)
    assert kinds == [ASYNC, SYNC, SYNC]  # async measured first, then sync; then sync wins
    assert policy.rate(SYNC, 1) == pytest.approx(3.33 / 0.56)
    assert policy.sync_now and policy.stats()["sync_mode"] == 1
    assert policy.stats()["rate_async_b1"] == pytest.approx(2.81 / 0.59)


def test_the_kind_in_use_keeps_its_place_within_the_margin() -> None:
    policy = SyncRoundPolicy("auto", margin=1.1)
    policy.observe(ASYNC, 1, 0.50, 3.0)  # 6.0 tok/s
    policy.observe(SYNC, 1, 0.50, 3.2)  # 6.4 tok/s: faster, but by less than 10%
    assert policy.choose(1) == ASYNC
    policy.observe(SYNC, 1, 0.30, 3.2)  # the moving average moves past the margin
    assert policy.rate(SYNC, 1) > 1.1 * policy.rate(ASYNC, 1)
    assert policy.choose(1) == SYNC


def test_the_other_kind_is_probed_at_doubling_intervals() -> None:
    policy = SyncRoundPolicy("auto", probes=ProbeSchedule(4, backoff_min=16, backoff_max=64))
    kinds = run(policy, 3 + 16 + 4 + 32 + 4 + 64 + 4 + 64 + 4)
    assert kinds[:3] == [ASYNC, SYNC, SYNC]  # sync took over at the third round
    runs = [(kind, len(list(group))) for kind, group in itertools.groupby(kinds[3:])]
    assert runs == [(SYNC, 16), (ASYNC, 4), (SYNC, 32), (ASYNC, 4), (SYNC, 64), (ASYNC, 4),
                    (SYNC, 64), (ASYNC, 4)]  # fmt: skip
    assert policy.sync_now  # every probe confirmed sync


def test_a_probe_that_finds_the_other_kind_faster_switches() -> None:
    policy = SyncRoundPolicy("auto", probes=ProbeSchedule(2, backoff_min=4))
    run(policy, 3)
    assert policy.sync_now
    for _ in range(40):  # the text turns predictable: pre-speculation now accepts far more
        kind = policy.choose(1)
        policy.observe(kind, 1, *((0.56, 3.33) if kind else (0.59, 5.0)))
    assert not policy.sync_now


def test_a_probe_replaces_a_stale_estimate() -> None:
    """Each run of a kind measures afresh at its batch sizes: pre-speculation judged by slow
    early rounds (4 tokens/s) is rated by the probe's own rounds (13 tokens/s), not a blend of
    both, and takes over at once; another batch size keeps its figures."""
    policy = SyncRoundPolicy("auto", probes=ProbeSchedule(4, backoff_min=4))
    policy.observe(ASYNC, 4, 1.0, 2.0)
    policy.observe(ASYNC, 1, 1.0, 4.0)  # slow first rounds (a cold start)
    policy.observe(SYNC, 1, 0.5, 5.0)  # 10 tokens/s
    assert policy.choose(1) == SYNC and policy.sync_now
    kinds = [policy.choose(1) for _ in range(5)]
    assert kinds == [SYNC] * 4 + [ASYNC]  # the probe begins
    policy.observe(ASYNC, 1, 0.3, 3.9)  # warm: 13 tokens/s
    assert policy.rate(ASYNC, 1) == pytest.approx(13.0)
    assert policy.rate(ASYNC, 4) == pytest.approx(2.0)  # not measured in this run: kept
    for _ in range(3):
        policy.choose(1)  # the probe's other rounds
    assert policy.choose(1) == ASYNC and not policy.sync_now


def test_each_batch_size_is_measured_near_itself() -> None:
    policy = SyncRoundPolicy("auto")
    run(policy, 3, batch_size=1)
    assert policy.rate(SYNC, 2, max_ratio=2.0) is not None  # 1 is within a factor 2 of 2
    assert policy.choose(4) == ASYNC  # nothing measured within a factor 2 of 4: measure it
    policy.observe(ASYNC, 4, 0.9, 2.5)
    assert policy.choose(4) == SYNC
    policy.observe(SYNC, 4, 0.8, 3.0)
    assert policy.rate(SYNC, 4, max_ratio=2.0) == pytest.approx(3.0 / 0.8)


def test_bad_settings_and_observations_are_refused() -> None:
    with pytest.raises(ValueError, match="setting"):
        SyncRoundPolicy("sometimes")
    with pytest.raises(ValueError, match="margin"):
        SyncRoundPolicy("auto", margin=0.9)
    for rounds, low, high in ((0, 16, 256), (4, 0, 256), (4, 32, 16)):
        with pytest.raises(ValueError, match="backoff"):
            ProbeSchedule(rounds, low, high)
    policy = SyncRoundPolicy("auto")
    with pytest.raises(ValueError):
        policy.choose(0)
    for bad in ((0, 0.5, 2.0), (1, 0.0, 2.0), (1, 0.5, 0.5), (1, float("nan"), 2.0)):
        with pytest.raises(ValueError):
            policy.observe(SYNC, *bad)

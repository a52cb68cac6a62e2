"""The arrangement policy: calibration per batch-size bucket, the fastest arrangement held from
synthetic round times and accept lengths, hysteresis and switch costs, re-probes, the
test-only cycle. No process, no SGLang."""

from __future__ import annotations

import logging

import pytest

from sglang_ssd.worker.arrangement_policy import ArrangementPolicy, bucket
from sglang_ssd.worker.round_mode import Arrangement, mode_refusal, offered

ASYNC, SYNC, PLAIN = Arrangement.ASYNC, Arrangement.SYNC, Arrangement.PLAIN
CPU = offered("auto", "cpu")
# Round seconds and tokens per request per round as measured at batch 1 on the 2-core EPYC:
# sync 3.40 / 0.455 s = 7.5, async 3.02 / 0.447 s = 6.8, plain 1 / 0.25 s = 4 tokens per second.
EPYC_B1 = {SYNC: (0.455, 3.40), ASYNC: (0.447, 3.02), PLAIN: (0.25, 1.0)}


def drive(policy: ArrangementPolicy, figures: dict, rounds: int, batch: int = 1) -> list:
    """`rounds` rounds at `batch`, each arrangement's round taking `figures[a]` = (seconds,
    tokens per request); the arrangements run, in order."""
    run = []
    for _ in range(rounds):
        a = policy.choose(batch, 100)
        run.append(a)
        seconds, tokens = figures[a]
        policy.observe(a, batch, seconds, tokens)
    return run


def test_calibration_measures_each_arrangement_then_holds_the_fastest(caplog) -> None:
    policy = ArrangementPolicy(CPU)
    with caplog.at_level(logging.INFO, logger="sglang_ssd.worker.arrangement_policy"):
        run = drive(policy, EPYC_B1, 12)
    # Each run's first round is its first since start (one-time costs): not measured.
    assert run[:9] == [SYNC] * 3 + [ASYNC] * 3 + [PLAIN] * 3
    assert run[9:] == [SYNC] * 3 and policy.held(1) == SYNC
    assert "calibrated b<=1: sync (sync 7.47 tok/s = 3.40 / 0.455 s" in caplog.text
    assert policy.rate(ASYNC, 1) == pytest.approx(3.02 / 0.447)
    row = policy.buckets()["1"]
    assert row["held"] == "sync" and row["plain"]["rate"] == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("figures", "fastest"),
    [
        (EPYC_B1, SYNC),
        ({SYNC: (0.5, 3.0), ASYNC: (0.3, 3.0), PLAIN: (0.25, 1.0)}, ASYNC),
        ({SYNC: (1.6, 2.0), ASYNC: (1.6, 1.8), PLAIN: (0.45, 1.0)}, PLAIN),  # batch 8 on 2 cores
    ],
)
def test_the_fastest_arrangement_by_measured_rate_is_held(figures: dict, fastest) -> None:
    policy = ArrangementPolicy(CPU)
    run = drive(policy, figures, 40)
    assert policy.held(1) == fastest and run[-5:] == [fastest] * 5


def test_each_bucket_calibrates_and_chooses_on_its_own() -> None:
    policy = ArrangementPolicy(CPU)
    drive(policy, EPYC_B1, 12, batch=1)
    batch8 = {SYNC: (1.6, 2.0), ASYNC: (1.6, 1.8), PLAIN: (0.45, 1.0)}
    drive(policy, batch8, 12, batch=7)  # bucket 8
    assert (policy.held(1), policy.held(8), policy.held(5)) == (SYNC, PLAIN, PLAIN)
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]


def test_hysteresis_keeps_the_held_arrangement_within_the_margin() -> None:
    # A horizon so long that any saving repays the switch: the margin alone decides.
    policy = ArrangementPolicy(CPU, margin=1.05, horizon_rounds=100_000)
    drive(policy, EPYC_B1, 12)
    sync_rate, async_figures = policy.rate(SYNC, 1), policy._figures[1][ASYNC]
    # Async's live figures now rate it 3 % faster than sync: not enough to switch.
    async_figures.tokens.value = 1.03 * sync_rate * async_figures.seconds.value
    run = drive(policy, EPYC_B1, 4)
    assert set(run) == {SYNC} and policy.switches == 0 and policy.preferred(1) == SYNC
    async_figures.tokens.value *= 1.05  # now 8 % faster: it takes over
    assert policy.preferred(1) == ASYNC and policy.choose(1, 100) == ASYNC


def test_a_switch_must_pay_for_its_measured_cost() -> None:
    policy = ArrangementPolicy((SYNC, ASYNC), margin=1.0, horizon_rounds=4)
    drive(policy, EPYC_B1, 9)
    assert policy.held(1) == SYNC
    # Async turns 10 % faster, but a switch into it costs 5 s (a cold cache): 4 rounds of it
    # save 0.15 s. Held.
    policy._switch_s[ASYNC].add(5.0)
    faster = {**EPYC_B1, ASYNC: (0.455 / 1.1 * 3.02 / 3.40, 3.02)}
    policy._figures[1][ASYNC].seconds.value = faster[ASYNC][0]
    assert policy.preferred(1) == SYNC
    policy._switch_s[ASYNC].value = 0.01  # a cheap switch: taken
    assert policy.preferred(1) == ASYNC


def test_the_other_arrangements_are_reprobed_and_a_faster_one_takes_over() -> None:
    policy = ArrangementPolicy(CPU)
    drive(policy, EPYC_B1, 12)
    run = drive(policy, EPYC_B1, 60)
    probes = [i for i in range(1, len(run)) if run[i] != SYNC and run[i - 1] == SYNC]
    assert len(probes) >= 2 and probes[1] - probes[0] > 16  # the interval doubles
    assert policy.held(1) == SYNC and policy.switches == 0
    # The text turns predictable: async's hits now carry far more. A probe finds it.
    better = {**EPYC_B1, ASYNC: (0.447, 4.5)}
    run = drive(policy, better, 120)
    assert policy.held(1) == ASYNC and policy.switches == 1
    assert run[-20:].count(ASYNC) >= 17  # probes aside


def test_one_token_left_is_plain_and_a_single_offer_is_always_run() -> None:
    policy = ArrangementPolicy(CPU)
    assert policy.choose(3, 1) == PLAIN and policy.held(3) is None
    fixed = ArrangementPolicy((ASYNC,))
    assert [fixed.choose(1, 1), fixed.choose(8, 100)] == [ASYNC, ASYNC]
    assert fixed.held(4) == ASYNC and fixed.stats()["async_rounds"] == 2


def test_the_test_cycle_switches_every_round() -> None:
    policy = ArrangementPolicy(CPU, cycle=True)
    run = drive(policy, EPYC_B1, 7)
    assert run == [SYNC, ASYNC, PLAIN, SYNC, ASYNC, PLAIN, SYNC]


def test_what_each_device_offers_and_refuses() -> None:
    assert offered("auto", "cpu") == (SYNC, ASYNC, PLAIN)
    assert offered("auto", "cuda:0") == (ASYNC,)
    assert offered("sync", "cuda:1") == (SYNC,) and offered("plain", "cpu") == (PLAIN,)
    assert mode_refusal("plain", "cpu") is None
    assert "γ + 1 positions" in (mode_refusal("plain", "cuda:1") or "")
    assert "must be one of" in (mode_refusal("turbo", "cpu") or "")


def test_bad_parameters_and_observations_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ArrangementPolicy(())
    with pytest.raises(ValueError, match="margin"):
        ArrangementPolicy(CPU, margin=0.9)
    policy = ArrangementPolicy(CPU)
    for bad in ((0, 0.5, 2.0), (1, 0.0, 2.0), (1, float("nan"), 2.0), (1, 0.5, 0.5)):
        with pytest.raises(ValueError):
            policy.observe(SYNC, *bad)
    with pytest.raises(ValueError):
        policy.choose(0, 10)

"""The arrangement policy: calibration per batch-size bucket, the fastest arrangement held from
synthetic round times and a synthetic text (chains, hits and misses), hysteresis and switch
costs, re-probes, the test-only cycle; the shared token figures. No process, no SGLang."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from sglang_ssd.saguaro.averages import RecentMedian
from sglang_ssd.worker.arrangement_policy import ROUND_WINDOW, ArrangementPolicy, bucket
from sglang_ssd.worker.round_mode import Arrangement, mode_refusal, offered
from sglang_ssd.worker.round_tokens import HIT_PRIOR, MISS_PRIOR, RoundTokens

ASYNC, SYNC, PLAIN = Arrangement.ASYNC, Arrangement.SYNC, Arrangement.PLAIN
CPU = offered("auto", "cpu")
# Round seconds as measured at batch 1 on the 2-core EPYC (sync 0.455 s, async 0.447 s, plain
# 0.25 s), with chains of 3.4 tokens: sync 7.5 tokens per second, async (3 hits in 4) 6.4.
EPYC_B1 = {SYNC: 0.455, ASYNC: 0.447, PLAIN: 0.25}
BATCH8 = {SYNC: 1.6, ASYNC: 1.6, PLAIN: 0.45}  # batch 8 on 2 cores: chains of 2 tokens


@dataclass
class Text:
    """What the draft's chains commit on the text being served (tokens per request), and the
    async cache's misses (every `miss_every`-th async round, `miss` tokens)."""

    chain: float = 3.4
    miss_every: int = 4
    miss: float = 1.2
    async_rounds: int = field(default=0, init=False)

    def round(self, a: Arrangement, batch: int) -> tuple[list[float], list[str]]:
        """Tokens per request and draft sources of one round of `a` at `batch`."""
        if a == PLAIN:
            return [1.0] * batch, ["plain"] * batch
        if a == SYNC:
            return [self.chain] * batch, ["jit"] * batch
        self.async_rounds += 1
        if self.async_rounds % self.miss_every == 0:
            return [self.miss] * batch, ["ngram"] * batch
        return [self.chain] * batch, ["cache"] * batch


def drive(policy: ArrangementPolicy, seconds: dict, rounds: int, batch: int = 1, text=None) -> list:
    """`rounds` rounds at `batch`, each arrangement's round taking `seconds[a]` on `text`
    (default: chains of 3.4 tokens); the arrangements run, in order."""
    text = text or Text()
    run = []
    for _ in range(rounds):
        a = policy.choose(batch, 100)
        run.append(a)
        policy.observe(a, batch, seconds[a], *text.round(a, batch))
    return run


def measure(policy: ArrangementPolicy, a: Arrangement, seconds: float) -> None:
    """Make `a`'s recent rounds at batch 1 all take `seconds`."""
    policy._figures[1][a].seconds = RecentMedian(ROUND_WINDOW)
    for _ in range(ROUND_WINDOW):
        policy._figures[1][a].seconds.add(seconds)


def test_round_times_are_a_median_that_one_time_costs_do_not_drag() -> None:
    policy = ArrangementPolicy(CPU)
    slow_start = iter([1.4, 3.0] + [0.455] * 20)  # the first lent-core rounds: one-time costs
    for _ in range(12):
        a = policy.choose(1, 100)
        seconds = next(slow_start) if a == SYNC else EPYC_B1[a]
        policy.observe(a, 1, seconds, *Text().round(a, 1))
    assert policy._figures[1][SYNC].seconds.value == 0.455 and policy.held(1) == SYNC
    median = RecentMedian(3)
    for x in (5.0, 1.0, 2.0, 0.5):
        median.add(x)
    assert (median.value, median.count) == (1.0, 4)  # of 1, 2, 0.5
    with pytest.raises(ValueError, match="window"):
        RecentMedian(0)


def test_calibration_measures_each_arrangement_then_holds_the_fastest(caplog) -> None:
    policy = ArrangementPolicy(CPU)
    with caplog.at_level(logging.INFO, logger="sglang_ssd.worker.arrangement_policy"):
        run = drive(policy, EPYC_B1, 12)
    # Each run's first round is its first since start (one-time costs): not measured.
    assert run[:9] == [SYNC] * 3 + [ASYNC] * 3 + [PLAIN] * 3
    assert run[9:] == [SYNC] * 3 and policy.held(1) == SYNC
    assert "calibrated b<=1: sync (sync 7.47 tok/s = 3.40 / 0.455 s" in caplog.text
    assert policy.tokens(SYNC, 1) == pytest.approx(3.4)
    # Two async rounds, both hits: the hit rate moved from its prior towards 1.
    hit = HIT_PRIOR + 0.1 * (1 - HIT_PRIOR)
    hit += 0.1 * (1 - hit)
    assert policy.tokens(ASYNC, 1) == pytest.approx(hit * 3.4 + (1 - hit) * MISS_PRIOR)
    row = policy.buckets()["1"]
    assert row["held"] == "sync" and row["plain"]["rate"] == pytest.approx(4.0)
    assert row["hit_rate"] == pytest.approx(hit)


@pytest.mark.parametrize(
    ("seconds", "chain", "fastest"),
    [
        (EPYC_B1, 3.4, SYNC),
        ({SYNC: 0.5, ASYNC: 0.3, PLAIN: 0.25}, 3.0, ASYNC),  # the build hides in the verify
        (BATCH8, 2.0, PLAIN),
    ],
)
def test_the_fastest_arrangement_by_measured_rate_is_held(seconds, chain, fastest) -> None:
    policy = ArrangementPolicy(CPU)
    run = drive(policy, seconds, 40, text=Text(chain=chain))
    assert policy.held(1) == fastest and run[-5:] == [fastest] * 5


def test_text_that_changes_between_arrangements_does_not_decide() -> None:
    """Sync calibrates on a hard passage (chains of 1.5 tokens), async on an easy one (4.5):
    rated on their own rounds async would look 1.6x faster; on the shared chain figure sync
    stays ahead, as it is on any one text."""
    policy = ArrangementPolicy(CPU)
    hard, easy = Text(chain=1.5), Text(chain=4.5)
    run = []
    for _ in range(6):
        a = policy.choose(1, 100)
        run.append(a)
        policy.observe(a, 1, EPYC_B1[a], *(hard if a == SYNC else easy).round(a, 1))
    assert run == [SYNC] * 3 + [ASYNC] * 3
    assert policy.rate(SYNC, 1) > policy.rate(ASYNC, 1)


def test_a_later_bucket_starts_from_the_nearest_and_probes_its_way_on() -> None:
    """Bucket 8 starts from what bucket 1 calibrated (sync), no calibration of its own; its
    probes measure async and plain there, and plain, fastest at batch 8, takes over."""
    policy = ArrangementPolicy(CPU)
    drive(policy, EPYC_B1, 12, batch=1)
    run = drive(policy, BATCH8, 16, batch=7, text=Text(chain=2.0))  # bucket 8
    assert run == [SYNC] * 16 and policy.held(8) == SYNC
    run = drive(policy, BATCH8, 80, batch=7, text=Text(chain=2.0))
    assert (policy.held(1), policy.held(8), policy.held(5)) == (SYNC, PLAIN, PLAIN)
    assert run[-10:] == [PLAIN] * 10 and policy.held(2) is None
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]


def test_hysteresis_keeps_the_held_arrangement_within_the_margin() -> None:
    # A horizon so long that any saving repays the switch: the margin alone decides.
    policy = ArrangementPolicy(CPU, margin=1.05, horizon_rounds=100_000)
    drive(policy, EPYC_B1, 12)
    sync_rate = policy.rate(SYNC, 1)
    # Async's rounds now measure 3 % faster than sync's rate: not enough to switch.
    measure(policy, ASYNC, policy.tokens(ASYNC, 1) / (1.03 * sync_rate))
    run = drive(policy, EPYC_B1, 4)
    assert set(run) == {SYNC} and policy.switches == 0 and policy.preferred(1) == SYNC
    measure(policy, ASYNC, policy.tokens(ASYNC, 1) / (1.08 * sync_rate))  # 8 %: it takes over
    assert policy.preferred(1) == ASYNC and policy.choose(1, 100) == ASYNC


def test_a_switch_must_pay_for_its_measured_cost() -> None:
    policy = ArrangementPolicy((SYNC, ASYNC), margin=1.0, horizon_rounds=4)
    drive(policy, EPYC_B1, 9)
    assert policy.held(1) == SYNC
    # Async turns 10 % faster, but a switch into it costs 5 s (a cold cache): 4 rounds of it
    # save 0.15 s. Held.
    policy._switch_s[ASYNC].add(5.0)
    measure(policy, ASYNC, policy.tokens(ASYNC, 1) / (1.1 * policy.rate(SYNC, 1)))
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
    # The speculator's build now hides inside a shorter verify: async rounds take 0.3 s.
    # A probe finds it.
    run = drive(policy, {**EPYC_B1, ASYNC: 0.3}, 120)
    assert policy.held(1) == ASYNC and policy.switches == 1
    assert run[-20:].count(ASYNC) >= 17  # probes aside


def test_only_contenders_are_reprobed_and_live_tokens_switch_without_a_probe() -> None:
    """Plain at batch 1 (4 tokens/s against sync's 7.5) is never re-probed; when the text turns
    hard (chains of 1.3 tokens) the live chain figure rates plain fastest, and it takes over
    without a probe."""
    policy = ArrangementPolicy(CPU)
    drive(policy, EPYC_B1, 12)
    run = drive(policy, EPYC_B1, 200)
    assert PLAIN not in run and ASYNC in run  # async (6.4 tokens/s) is within 1.5x: probed
    run = drive(policy, EPYC_B1, 12, text=Text(chain=1.3))
    assert policy.held(1) == PLAIN and run[-3:] == [PLAIN] * 3


def test_shared_token_figures_count_chains_hits_and_misses() -> None:
    shared = RoundTokens()
    assert shared.tokens(SYNC) is None and shared.tokens(PLAIN) == 1.0
    shared.observe(SYNC, [5, 1], ["jit", "ngram"])  # a degraded draft is no chain
    shared.observe(PLAIN, [1, 1], ["plain", "plain"])  # plain rounds draft nothing
    assert shared.chain.value == 5 and shared.hit.value == HIT_PRIOR  # sync looks nothing up
    shared.observe(ASYNC, [3, 2], ["cache", "ngram"])
    assert shared.chain.value == pytest.approx(0.8 * 5 + 0.2 * 3)
    assert shared.hit.value == pytest.approx(0.9 * HIT_PRIOR + 0.1 * 0.5)
    assert shared.miss.value == pytest.approx(0.7 * MISS_PRIOR + 0.3 * 2)
    hit, chain, miss = shared.hit.value, shared.chain.value, shared.miss.value
    assert shared.tokens(ASYNC) == pytest.approx(hit * chain + (1 - hit) * miss)
    with pytest.raises(ValueError, match="one source per request"):
        shared.observe(SYNC, [1, 2], ["jit"])


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
    with pytest.raises(ValueError, match="probe_within"):
        ArrangementPolicy(CPU, probe_within=1.0)
    policy = ArrangementPolicy(CPU)
    bad_rounds = (
        (0, 0.5, [], []),
        (1, 0.0, [2.0], ["jit"]),
        (1, float("nan"), [2.0], ["jit"]),
        (1, 0.5, [0.5], ["jit"]),
        (2, 0.5, [2.0], ["jit"]),
    )
    for bad in bad_rounds:
        with pytest.raises(ValueError):
            policy.observe(SYNC, *bad)
    with pytest.raises(ValueError):
        policy.choose(0, 10)

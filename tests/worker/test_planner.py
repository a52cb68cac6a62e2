"""The round planner: the round's arrangement once per round, the Step's backup and tree depth
only when a Step goes out, and what each round's drafts and outcomes teach the miss policy, the
depth tuner and the arrangement policy. No process, no SGLang."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import Backup
from sglang_ssd.saguaro.acceptance import AcceptanceCounts
from sglang_ssd.transport import SpeculatorTiming, TransportError
from sglang_ssd.worker.draft_batch import DraftBatch
from sglang_ssd.worker.draft_provider import LocalNgramProvider
from sglang_ssd.worker.metrics import count_request_rounds
from sglang_ssd.worker.planner import (
    PREFILL_LEND_TOKENS,
    WARM_ROUNDS,
    RoundPlanner,
    StepChoice,
    default_policy,
)
from sglang_ssd.worker.round_mode import Arrangement, RoundMode
from sglang_ssd.worker.round_tokens import HIT_PRIOR, HIT_WEIGHT, MISS_PRIOR
from sglang_ssd.worker.speculator_client import SpeculatorClient

ASYNC, SYNC, PLAIN = Arrangement.ASYNC, Arrangement.SYNC, Arrangement.PLAIN

GAMMA = 4


def req(rid: str, max_new_tokens: int | None = 16, output: int = 0) -> Any:
    """An SGLang-like request with `output` tokens generated so far."""
    return SimpleNamespace(
        rid=rid,
        origin_input_ids=[1, 2, 3, 1, 2, 3],
        output_ids=[1] * output,
        sampling_params=SimpleNamespace(max_new_tokens=max_new_tokens),
    )


@pytest.mark.parametrize(
    ("setting", "reqs", "arrangement"),
    [
        ("async", [req("a"), req("b", max_new_tokens=1)], ASYNC),
        ("plain", [req("a")], PLAIN),
        ("sync", [req("a")], SYNC),
        ("auto", [req("a")], SYNC),  # calibration starts with the CPU's prior
        ("auto", [req("a", 4, output=3), req("b", None)], SYNC),
        ("auto", [req("a", 4, output=3), req("b", 1)], PLAIN),  # no token to draft
    ],
)
def test_the_arrangement_is_decided_once_per_round(setting: str, reqs: list, arrangement):
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA, mode=setting))
    assert planner.plan(reqs) == arrangement
    assert planner.plain_rounds == (arrangement == PLAIN)
    stats = planner.stats()
    assert stats["speculative_rounds"] == (arrangement != PLAIN)
    assert stats[f"{arrangement}_rounds"] == 1
    counts = ("plain_rounds", "speculative_rounds", "arrangement_switches", "tree_depth")
    assert all(type(stats[k]) is int for k in counts) and type(stats["tree_depth_pinned"]) is bool


def test_a_gpu_offers_async_alone_and_refuses_plain() -> None:
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA), "cuda:0")
    assert planner.arrangements.offered == (ASYNC,)
    assert planner.plan([req("a", 4, output=3)]) == ASYNC  # even with one token left
    assert RoundPlanner(SSDConfig(mode="sync"), "cuda").arrangements.offered == (SYNC,)
    with pytest.raises(ValueError, match="plain is not supported on cuda"):
        RoundPlanner(SSDConfig(mode="plain"), "cuda:0")
    with pytest.raises(ValueError, match="plain is not supported"):
        planner.apply({"mode": "plain"}, SSDConfig(mode="plain"))


def test_the_step_carries_the_backup_and_depth_in_force() -> None:
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA, backup="ngram"))
    assert planner.step(2) == StepChoice(backup="ngram", tree_depth=GAMMA)  # γ before a build
    config = SSDConfig(lookahead=GAMMA, backup="jit", tree_depth=2)
    planner.apply({"tree_depth": 2, "backup": "jit"}, config)
    assert planner.step(2) == StepChoice(backup="jit", tree_depth=2) and planner.tree_depth == 2
    planner.apply({"tree_depth": 0}, config.replace(tree_depth=None))  # self-tunes from D = 2
    assert planner.stats()["tree_depth_pinned"] == 0.0 and planner.step(1).tree_depth == 2
    sync = RoundPlanner(SSDConfig(lookahead=GAMMA, mode="sync", backup="ngram"))
    sync.plan_round([req("a")], OutcomeSpy())
    assert sync.step(8) == StepChoice("jit", 0, prespeculate=False) and sync.tree_depth == 0


class StepSpy(RoundPlanner):
    """A planner that counts the Steps it shaped."""

    def __init__(self) -> None:
        super().__init__(SSDConfig(lookahead=GAMMA, mode="auto"))
        self.steps = 0

    def step(self, batch_size: int) -> StepChoice:
        self.steps += 1
        return super().step(batch_size)


def client_over(usable: bool) -> SpeculatorClient:
    """A client whose speculator is down (`usable` False) or times out on every Step."""
    client = object.__new__(SpeculatorClient)
    client.lock = threading.Lock()
    client.supervisor = SimpleNamespace(usable=lambda: usable, fault=lambda reason: None)
    client.local = LocalNgramProvider(GAMMA)

    def timeout(reqs: Any, planner: RoundPlanner) -> DraftBatch:
        planner.step(len(reqs))  # the Step went out, then no drafts came
        raise TransportError("no drafts within 0.5 s")

    client._remote_drafts = timeout
    return client


def test_only_a_step_sent_asks_for_a_backup_and_depth() -> None:
    """The tuner's choice moves its state: a round the target drafts alone chooses nothing."""
    planner, reqs = StepSpy(), [req("a"), req("b")]
    batch = client_over(usable=False).drafts(reqs, planner)
    assert batch.sources == ["local-ngram"] * 2 and planner.steps == 0
    batch = client_over(usable=True).drafts(reqs, planner)
    assert batch.sources == ["local-ngram"] * 2 and planner.steps == 1


def test_outcomes_teach_the_policy_and_the_tuner_from_the_rounds_drafts() -> None:
    config = SSDConfig(lookahead=GAMMA)
    planner = RoundPlanner(config)
    drafts = DraftBatch(
        tokens=torch.zeros(4, GAMMA, dtype=torch.int64),
        depth=torch.tensor([2, GAMMA, 3, GAMMA]),
        q=None,
        has_q=torch.zeros(4, dtype=torch.bool),
        sources=["cache", "ngram", "cache", "local-ngram"],
    )
    timing = SpeculatorTiming(build_s=0.3, backup_s=0.02)
    planner.observe_outcomes(drafts, [2, 1, 0, 3], 0.25, timing)

    hits = AcceptanceCounts()
    hits.observe([2, 0], [2, 3])  # each hit's k against its own depth D
    assert planner.tuner.alpha == pytest.approx(hits.alpha)
    expected = default_policy(config)
    expected.observe(hit_rate=0.5, t_verify=0.25, t_spec=0.3)
    expected.alpha_hit = hits.alpha
    expected.observe(backup=Backup("ngram"), accept_length_backup=2.0, t_backup=0.02)
    policy = planner.policy
    assert (policy.p_hit, policy.t_verify, policy.t_spec, policy.alpha_hit) == pytest.approx(
        (expected.p_hit, expected.t_verify, expected.t_spec, expected.alpha_hit)
    )
    assert policy.backups == expected.backups  # the n-gram backup learned, JIT untouched

    before = (policy.t_verify, policy.t_spec)
    planner.observe_outcomes(drafts, [0, 0, 0, 0], None, None)  # nothing timed this round
    assert (policy.t_verify, policy.t_spec) == before


def test_a_rounds_backup_seconds_are_the_just_in_time_drafts() -> None:
    """A request still prefilling gets an n-gram draft beside another's just-in-time draft: the
    Step's backup seconds (the JIT draft's) must not teach the n-gram backup that it is slow."""
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA, mode="auto"))
    drafts = DraftBatch(
        tokens=torch.zeros(2, GAMMA, dtype=torch.int64),
        depth=torch.tensor([GAMMA, GAMMA]),
        q=None,
        has_q=torch.zeros(2, dtype=torch.bool),
        sources=["jit", "ngram"],
    )
    planner.observe_outcomes(drafts, [3, 0], 0.5, SpeculatorTiming(backup_s=0.22))
    jit, ngram = planner.policy.backups[Backup.JIT], planner.policy.backups[Backup.NGRAM]
    guesses = default_policy(SSDConfig()).backups
    assert jit.latency == pytest.approx((guesses[Backup.JIT].latency + 0.22) / 2)
    assert jit.observations == 1 and ngram.latency == guesses[Backup.NGRAM].latency
    assert ngram.observations == 1  # its accept length was measured


def test_the_mode_and_backups_change_live() -> None:
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA, mode="async"))
    planner.apply({"mode": "plain", "backup": "random"}, SSDConfig(lookahead=GAMMA, mode="plain"))
    assert planner.prefill_lends_cores(1, 1) and planner.policy.mode == Backup("random")
    assert planner.plan([req("a")]) == PLAIN and planner.plain_rounds == 1
    planner.apply({"backup": "auto", "mode": "auto"}, SSDConfig(lookahead=GAMMA, mode="auto"))
    assert planner.policy.mode == "auto" and planner.arrangements.offered == (SYNC, ASYNC, PLAIN)


class OutcomeSpy:
    """A speculator client that drafts nothing remotely and keeps the outcomes it is given."""

    last_timing = None

    def __init__(self) -> None:
        self.local = LocalNgramProvider(GAMMA)
        self.outcomes: list[tuple[list[str], list[int], list[int]]] = []
        self.choices: list[StepChoice] = []
        self.source = "jit"

    def drafts(self, reqs: Any, planner: RoundPlanner) -> DraftBatch:
        self.choices.append(planner.step(len(reqs)))
        batch = self.local.drafts(reqs)
        batch.sources = [self.source] * len(reqs)  # as if the speculator drafted them
        return batch

    def record_outcomes(self, rids: Any, accept_lens: list[int], bonus: list[int]) -> None:
        self.outcomes.append((list(rids), accept_lens, bonus))


def close(planner: RoundPlanner, client: Any, reqs: Any, plan: Any, *measured: Any) -> None:
    """Close a round as `SSDWorker` does: the planner, then the requests' round counts."""
    planner.close_round(client, reqs, plan, *measured)
    count_request_rounds(reqs, plan.drafts.sources)


def test_a_round_closes_by_its_arrangement() -> None:
    """A speculative round's outcomes go to the client; a plain round's tokens do not (they
    reach the speculator as `Outcome.extra`); each round's time and tokens per request go to
    the arrangement policy, which skips each arrangement's first round, every switch and a
    request's first `WARM_ROUNDS` rounds."""
    config = SSDConfig(lookahead=GAMMA, mode="async")
    planner, client, reqs = RoundPlanner(config), OutcomeSpy(), [req("a")]
    rate = planner.arrangements.rate
    client.source = "cache"
    spec = planner.plan_round(reqs, client)
    assert spec.mode == RoundMode.SPECULATE and spec.width(GAMMA) == GAMMA + 1
    assert not spec.lends_cores and spec.drafts.sources == ["cache"]
    assert client.choices[-1].prespeculate
    close(planner, client, reqs, spec, ([1], [7]), 0.2, 1.8)  # the first: one-time costs
    assert client.outcomes == [(["a"], [1], [7])] and rate(ASYNC, 1) is None
    for _ in range(WARM_ROUNDS - 1):  # the rest of the request's first rounds: not rated
        close(planner, client, reqs, spec, ([2], [7]), 0.2, 0.9)
    assert rate(ASYNC, 1) is None
    close(planner, client, reqs, spec, ([2], [7]), 0.2, 0.5)
    assert client.outcomes[-1] == (["a"], [2], [7])
    # A hit's chain of 3 tokens, the hit rate a step from its prior towards 1.
    hit = HIT_PRIOR + HIT_WEIGHT * (1 - HIT_PRIOR)
    assert rate(ASYNC, 1) == pytest.approx((hit * 3.0 + (1 - hit) * MISS_PRIOR) / 0.5)
    async_rate = rate(ASYNC, 1)

    planner.apply({"mode": "plain"}, config.replace(mode="plain"))
    plain = planner.plan_round(reqs, client)
    assert plain.mode == RoundMode.PLAIN and plain.width(GAMMA) == 1 and plain.lends_cores
    close(planner, client, reqs, plain, ([0], [5]), 0.1, 0.9)  # the first plain round
    close(planner, client, reqs, plain, ([0], [5]), 0.1, 0.25)
    assert len(client.outcomes) == 3 and rate(PLAIN, 1) == pytest.approx(1 / 0.25)

    planner.apply({"mode": "async"}, config)
    cold = planner.plan_round(reqs, client)
    close(planner, client, reqs, cold, ([0], [9]), 0.2, 9.0)  # the switch: slow, cold
    assert client.outcomes[-1] == (["a"], [0], [9])
    assert rate(ASYNC, 1) == pytest.approx(async_rate)  # not a rate: the switch's cost
    assert planner.arrangements.switch_cost(ASYNC, 1) == pytest.approx(9.0 - 1 / async_rate)


def test_a_sync_round_drafts_just_in_time_on_every_core() -> None:
    """A sync round asks a just-in-time draft with no pre-speculation after it and verifies on
    the speculator's cores too; its times and tokens go to the arrangement policy, never its
    hit rate or verify time to the miss policy (no pre-speculation ran before it)."""
    config = SSDConfig(lookahead=GAMMA, mode="sync")
    planner, client, reqs = RoundPlanner(config), OutcomeSpy(), [req("a", output=0)]
    count_request_rounds(reqs * WARM_ROUNDS, ["jit"] * WARM_ROUNDS)  # past its first rounds
    before = (planner.policy.p_hit, planner.policy.t_verify)
    sync = planner.plan_round(reqs, client)
    assert sync.mode == RoundMode.SPECULATE and sync.sync and sync.lends_cores
    assert sync.width(GAMMA) == GAMMA + 1
    assert client.choices == [StepChoice("jit", 0, prespeculate=False)]
    planner.close_round(client, reqs, sync, ([3], [7]), 0.2, 1.5)  # the first: one-time costs
    planner.close_round(client, reqs, sync, ([3], [7]), 0.2, 0.5)
    assert planner.arrangements.rate(SYNC, 1) == pytest.approx(4 / 0.5)
    assert (planner.policy.p_hit, planner.policy.t_verify) == before
    assert (planner.stats()["sync_rounds"], planner.stats()["async_rounds"]) == (1, 0)

    planner.apply({"mode": "async"}, config.replace(mode="async"))
    ahead = planner.plan_round(reqs, client)
    assert not ahead.sync and not ahead.lends_cores and client.choices[-1].prespeculate
    planner.close_round(client, reqs, ahead, ([0], [7]), 0.3, 0.9)  # its first round
    assert planner.policy.p_hit != before[0]  # pre-speculated rounds teach the miss policy


def test_prefills_lend_the_speculators_cores_by_size_and_arrangement() -> None:
    """While async is held only long prefills lend the cores; under sync or plain every
    prefill does (the speculator idles between rounds)."""
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA, mode="async"))
    assert not planner.prefill_lends_cores(PREFILL_LEND_TOKENS - 1, 1)
    assert planner.prefill_lends_cores(PREFILL_LEND_TOKENS, 1)
    sync = RoundPlanner(SSDConfig(lookahead=GAMMA, mode="sync"))
    assert sync.prefill_lends_cores(1, 4)
    auto = RoundPlanner(SSDConfig(lookahead=GAMMA, mode="auto"))  # calibrating: nothing held yet
    assert auto.prefill_lends_cores(1, 1)


def test_the_log_line_names_the_arrangement_held_and_its_rates() -> None:
    planner, client, reqs = (
        RoundPlanner(SSDConfig(lookahead=GAMMA, mode="auto")),
        OutcomeSpy(),
        [req("a")],
    )
    count_request_rounds(reqs * WARM_ROUNDS, ["jit"] * WARM_ROUNDS)  # past its first rounds
    assert planner.describe() == ""
    figures = {SYNC: ([3], 0.5), ASYNC: ([3], 0.5), PLAIN: ([0], 0.25)}
    for _ in range(10):  # calibration: 3 rounds of each (the first of each not rated), then sync
        plan = planner.plan_round(reqs, client)
        accepted, seconds = figures[plan.arrangement]
        planner.close_round(client, reqs, plan, (accepted, [7]), 0.1, seconds)
    assert planner.held(1) == SYNC
    async_tokens = planner.arrangements.tokens(ASYNC, 1)
    assert 1 < async_tokens < 4  # its misses from a prior of 1.2 tokens towards 4
    assert planner.describe() == (
        f"b<=1: sync (sync 8.00 tok/s = 4.00 / 0.500 s, async {async_tokens / 0.5:.2f} tok/s = "
        f"{async_tokens:.2f} / 0.500 s, plain 4.00 tok/s = 1.00 / 0.250 s)"
    )


def test_a_round_capped_by_a_requests_limit_does_not_rate_its_arrangement() -> None:
    """A request with γ or fewer tokens left cannot take a full chain (the startup warm-up's
    short requests): its round's tokens say nothing of the arrangement."""
    planner, client = RoundPlanner(SSDConfig(lookahead=GAMMA, mode="sync")), OutcomeSpy()
    a, b = req("a"), req("b", GAMMA)
    count_request_rounds([a, b] * WARM_ROUNDS, ["jit"] * 2 * WARM_ROUNDS)
    for reqs, seconds in (([a], 0.5), ([a], 0.5), ([b], 0.1)):
        plan = planner.plan_round(reqs, client)
        planner.close_round(client, reqs, plan, ([0], [7]), 0.1, seconds)
    assert planner.arrangements.rate(SYNC, 1) == pytest.approx(1 / 0.5)  # the capped one left out


def test_first_rounds_are_prespeculated_unless_sync_comes_next() -> None:
    """A prefill's requests get their first round pre-speculated unless the round after it
    is sync (sync alone offered, or held at that batch size): its draft is just in time."""
    assert not RoundPlanner(SSDConfig(lookahead=GAMMA, mode="sync")).prespeculates(1)
    assert RoundPlanner(SSDConfig(lookahead=GAMMA, mode="async")).prespeculates(1)
    auto, client, reqs = (
        RoundPlanner(SSDConfig(lookahead=GAMMA, mode="auto")),
        OutcomeSpy(),
        [req("a")],
    )
    assert auto.prespeculates(1)  # calibrating: nothing held yet
    count_request_rounds(reqs * WARM_ROUNDS, ["jit"] * WARM_ROUNDS)
    figures = {SYNC: ([3], 0.5), ASYNC: ([3], 0.5), PLAIN: ([0], 0.25)}
    for _ in range(10):  # calibration, then sync held at batch 1
        plan = auto.plan_round(reqs, client)
        accepted, seconds = figures[plan.arrangement]
        auto.close_round(client, reqs, plan, (accepted, [7]), 0.1, seconds)
    assert auto.held(1) == SYNC and not auto.prespeculates(1) and auto.prespeculates(8)

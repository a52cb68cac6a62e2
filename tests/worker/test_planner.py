"""The round planner (issue 29, item 1): the round's mode once per round, the Step's backup and
tree depth only when a Step goes out, and what each round's drafts and outcomes teach the miss
policy and the depth tuner. No process, no SGLang."""

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
from sglang_ssd.worker.planner import RoundPlanner, StepChoice, default_policy
from sglang_ssd.worker.round_mode import RoundMode
from sglang_ssd.worker.speculator_client import SpeculatorClient
from sglang_ssd.worker.sync_rounds import ASYNC, SYNC

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
    ("setting", "reqs", "mode"),
    [
        ("never", [req("a"), req("b", max_new_tokens=1)], RoundMode.SPECULATE),
        ("always", [req("a")], RoundMode.PLAIN),
        ("auto", [req("a")], RoundMode.SPECULATE),  # L_r unknown yet: measure it
        ("auto", [req("a", 4, output=3), req("b", None)], RoundMode.SPECULATE),
        ("auto", [req("a", 4, output=3), req("b", 1)], RoundMode.PLAIN),  # no token to draft
    ],
)
def test_the_round_mode_is_decided_once_per_round(setting: str, reqs: list, mode: RoundMode):
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA, plain_rounds=setting))
    assert planner.plan(reqs) == mode
    assert planner.plain_rounds == (mode == RoundMode.PLAIN)
    stats = planner.stats()
    assert stats["speculative_rounds"] == (mode == RoundMode.SPECULATE)
    counts = ("plain_rounds", "speculative_rounds", "plain_mode", "tree_depth")
    assert all(type(stats[k]) is int for k in counts) and type(stats["tree_depth_pinned"]) is bool


def test_the_step_carries_the_backup_and_depth_in_force() -> None:
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA, backup="ngram"))
    assert planner.step(2) == StepChoice(backup="ngram", tree_depth=GAMMA)  # γ before a build
    config = SSDConfig(lookahead=GAMMA, backup="jit", tree_depth=2)
    planner.apply({"tree_depth": 2, "backup": "jit"}, config)
    assert planner.step(2) == StepChoice(backup="jit", tree_depth=2) and planner.tree_depth == 2
    planner.apply({"tree_depth": 0}, config.replace(tree_depth=None))  # self-tunes from D = 2
    assert planner.stats()["tree_depth_pinned"] == 0.0 and planner.step(1).tree_depth == 2
    sync = RoundPlanner(SSDConfig(lookahead=GAMMA, mode="sync", backup="ngram"))
    assert sync.step(8) == StepChoice("jit", 0, prespeculate=False) and sync.tree_depth == 0


class StepSpy(RoundPlanner):
    """A planner that counts the Steps it shaped."""

    def __init__(self) -> None:
        super().__init__(SSDConfig(lookahead=GAMMA))
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
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA))
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


def test_plain_rounds_and_backups_change_live() -> None:
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA))
    planner.apply({"plain_rounds": "always", "backup": "random"}, SSDConfig(lookahead=GAMMA))
    assert planner.prefill_lends_cores(1) and planner.policy.mode == Backup("random")
    assert planner.plan([req("a")]) == RoundMode.PLAIN and planner.plain_rounds == 1
    planner.apply({"backup": "auto"}, SSDConfig(lookahead=GAMMA))
    assert planner.policy.mode == "auto"


class OutcomeSpy:
    """A speculator client that drafts nothing remotely and keeps the outcomes it is given."""

    last_timing = None

    def __init__(self) -> None:
        self.local = LocalNgramProvider(GAMMA)
        self.outcomes: list[tuple[list[str], list[int], list[int]]] = []
        self.choices: list[StepChoice] = []

    def drafts(self, reqs: Any, planner: RoundPlanner) -> DraftBatch:
        self.choices.append(planner.step(len(reqs)))
        return self.local.drafts(reqs)

    def record_outcomes(self, rids: Any, accept_lens: list[int], bonus: list[int]) -> None:
        self.outcomes.append((list(rids), accept_lens, bonus))


def test_a_round_closes_by_its_mode() -> None:
    """A speculative round's outcomes go to the client and into the L_r and round times; a
    plain round's tokens do not (they reach the speculator as `Outcome.extra`); the speculative
    round after plain ones pays the switch and its time is not measured, nor is each mode's
    first round since start (one-time costs)."""
    planner, client, reqs = RoundPlanner(SSDConfig(lookahead=GAMMA)), OutcomeSpy(), [req("a")]
    spec = planner.plan_round(reqs, client)
    assert spec.mode == RoundMode.SPECULATE and spec.width(GAMMA) == GAMMA + 1
    assert not spec.lends_cores and spec.drafts.sources == ["local-ngram"]
    planner.close_round(client, reqs, spec, ([1], [7]), 0.2, 1.8)  # the first: one-time costs
    assert client.outcomes == [(["a"], [1], [7])]
    assert planner.round_mode.rate(RoundMode.SPECULATE, 1) is None
    assert not hasattr(reqs[0], "ssd_accept_length")
    planner.close_round(client, reqs, spec, ([2], [7]), 0.2, 0.5)
    assert client.outcomes[-1] == (["a"], [2], [7])
    assert planner.round_mode.rate(RoundMode.SPECULATE, 1, 3.0) == pytest.approx(3.0 / 0.5)
    assert reqs[0].ssd_accept_length.value == 3.0  # k + 1 tokens this round

    planner.apply({"plain_rounds": "always"}, SSDConfig(lookahead=GAMMA))
    plain = planner.plan_round(reqs, client)
    assert plain.mode == RoundMode.PLAIN and plain.width(GAMMA) == 1 and plain.lends_cores
    planner.close_round(client, reqs, plain, ([0], [5]), 0.1, 0.9)  # the first plain round
    assert planner.round_mode.rate(RoundMode.PLAIN, 1) == pytest.approx(1 / (0.5 * 0.5))  # prior
    planner.close_round(client, reqs, plain, ([0], [5]), 0.1, 0.25)
    assert len(client.outcomes) == 2 and reqs[0].ssd_accept_length.count == 1
    assert planner.round_mode.rate(RoundMode.PLAIN, 1) == pytest.approx(1 / 0.25)

    planner.apply({"plain_rounds": "never"}, SSDConfig(lookahead=GAMMA))
    cold = planner.plan_round(reqs, client)
    planner.close_round(client, reqs, cold, ([0], [9]), 0.2, 9.0)  # the switch: slow, cold
    assert client.outcomes[-1] == (["a"], [0], [9])
    assert planner.round_mode.rate(RoundMode.SPECULATE, 1) == pytest.approx(1 / 0.5)
    assert reqs[0].ssd_accept_length.count == 1


def test_a_sync_round_drafts_just_in_time_on_lent_cores() -> None:
    """`--ssd-sync-rounds`: a sync round asks a just-in-time draft with no pre-speculation
    after it and verifies on the speculator's cores too; its times and tokens go to the sync
    policy (not the first round of a kind, nor one right after the other kind), never its hit
    rate or verify time to the miss policy (no pre-speculation ran before it)."""
    config = SSDConfig(lookahead=GAMMA, sync_rounds="always")
    planner, client, reqs = RoundPlanner(config), OutcomeSpy(), [req("a")]
    before = (planner.policy.p_hit, planner.policy.t_verify)
    sync = planner.plan_round(reqs, client)
    assert sync.mode == RoundMode.SPECULATE and sync.sync and sync.lends_cores
    assert sync.width(GAMMA) == GAMMA + 1
    assert client.choices == [StepChoice("jit", 0, prespeculate=False)]
    planner.close_round(client, reqs, sync, ([3], [7]), 0.2, 1.5)  # the first: one-time costs
    planner.close_round(client, reqs, sync, ([3], [7]), 0.2, 0.5)
    assert planner.sync_rounds.rate(SYNC, 1) == pytest.approx(4 / 0.5)
    assert planner.round_mode.rate(RoundMode.SPECULATE, 1, 4.0) == pytest.approx(4 / 0.5)
    assert (planner.policy.p_hit, planner.policy.t_verify) == before
    assert (planner.stats()["sync_rounds"], planner.stats()["async_rounds"]) == (1, 0)

    planner.apply({"sync_rounds": "never"}, config)
    ahead = planner.plan_round(reqs, client)
    assert not ahead.sync and not ahead.lends_cores and client.choices[-1].prespeculate
    planner.close_round(client, reqs, ahead, ([0], [7]), 0.3, 0.9)  # cold after a sync round
    assert planner.sync_rounds.rate(ASYNC, 1) is None
    assert planner.policy.p_hit != before[0]  # pre-speculated rounds teach the miss policy
    planner.close_round(client, reqs, ahead, ([2], [7]), 0.3, 0.6)
    assert planner.sync_rounds.rate(ASYNC, 1) == pytest.approx(3 / 0.6)

    planner.apply({"sync_rounds": "always"}, config)
    again = planner.plan_round(reqs, client)  # may hit the cache built after `ahead`
    planner.close_round(client, reqs, again, ([3], [7]), 0.2, 0.1)
    assert planner.sync_rounds.rate(SYNC, 1) == pytest.approx(4 / 0.5)  # not measured


def test_sync_mode_never_runs_sync_rounds() -> None:
    """`--ssd-mode sync` drafts every round just in time already, on its own cores."""
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA, mode="sync", sync_rounds="always"))
    plan = planner.plan_round([req("a")], OutcomeSpy())
    assert not plan.sync and not plan.lends_cores


def test_long_prefills_lend_the_speculators_cores_from_the_live_threshold() -> None:
    planner = RoundPlanner(SSDConfig(lookahead=GAMMA, prefill_lend_tokens=100))
    assert not planner.prefill_lends_cores(99) and planner.prefill_lends_cores(100)
    never = SSDConfig(lookahead=GAMMA, prefill_lend_tokens=0)
    planner.apply({"prefill_lend_tokens": 0}, never)
    assert not planner.prefill_lends_cores(10_000)
    planner.apply({"plain_rounds": "always"}, never.replace(plain_rounds="always"))
    assert planner.prefill_lends_cores(1)  # plain rounds in use: the speculator idles anyway

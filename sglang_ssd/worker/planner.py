"""What each decode round does, decided on the target side: `RoundPlanner`.

`SSDWorker` asks the planner once per round for the round's mode (speculate, or a plain round:
`RoundModePolicy`) and, for a speculative round, its kind (pre-speculated, or a sync round
drafted just in time with the speculator's cores lent to the verify: `SyncRoundPolicy`); in a
speculative round the speculator client asks it for the Step's backup (`FallbackPolicy`, the
cache-miss option for this batch size) and tree depth D (`DepthTuner`) when it sends the
Step. The planner learns from what the round measured: the speculator's build timings as Drafts
arrive, then the verified outcomes, then the round's wall time. It holds no link and no request
state (that is `speculator_client`), so it is tested without a process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import Backup, BackupStats, FallbackPolicy, draft_kinds
from sglang_ssd.saguaro.self_tuning import DepthTuner
from sglang_ssd.transport import SpeculatorTiming
from sglang_ssd.worker.draft_batch import DraftBatch
from sglang_ssd.worker.round_mode import (
    RoundMode,
    RoundModePolicy,
    record_request_tokens,
    request_accept_length,
)
from sglang_ssd.worker.sync_rounds import SYNC, SyncRoundPolicy
from sglang_ssd.worker.tp_sync import RoundPlan

ALL_TOKENS_LEFT = 1 << 30  # tokens left of a request without max_new_tokens


def default_policy(config: SSDConfig) -> FallbackPolicy:
    """The miss policy before measurements arrive (times in seconds; refined live)."""
    return FallbackPolicy(
        lookahead=config.lookahead,
        p_hit=0.6,
        alpha_hit=0.8,
        t_verify=0.5,
        t_spec=0.6,
        backups={
            Backup(k.name): BackupStats(alpha=k.prior_alpha, latency=k.prior_latency_s)
            for k in draft_kinds.KINDS
            if k.speculator
        },
        mode=config.backup,
        batch_threshold_override=config.batch_threshold if config.backup == "auto" else None,
    )


class DraftSource(Protocol):
    """What the planner needs of the speculator client (`SpeculatorClient`)."""

    last_timing: SpeculatorTiming | None

    def drafts(self, reqs: Sequence[Any], planner: RoundPlanner) -> DraftBatch: ...

    def record_outcomes(
        self, rids: Sequence[str], accept_lens: list[int], bonus: list[int]
    ) -> None: ...


@dataclass(frozen=True)
class StepChoice:
    """What one Step asks of the speculator: `backup` (a `Backup` value) on a cache miss,
    `tree_depth` D of the build after it (0 in sync mode) and whether that build runs
    (`prespeculate`: False in sync mode and in sync rounds)."""

    backup: str
    tree_depth: int
    prespeculate: bool = True


class RoundPlanner:
    """The round's decisions and the measurements they rest on (see the module docstring).

    Attributes:
        policy: the cache-miss policy (`/ssd/stats`' `fallback` reads it).
        round_mode: speculate or plain (`--ssd-plain-rounds`).
        sync_rounds: a speculative round pre-speculated or drafted just in time with the cores
            lent (`--ssd-sync-rounds`).
        tuner: D per build: self-tuned unless `--ssd-tree-depth` (or `POST /ssd/config`) pins it.
    """

    def __init__(self, config: SSDConfig) -> None:
        self.sync = config.mode == "sync"  # not a live setting: fixed for the server's life
        self.policy = default_policy(config)
        self.round_mode = RoundModePolicy(config.plain_rounds)
        self.sync_rounds = SyncRoundPolicy(config.sync_rounds)
        self._sync_round = False  # the round being planned is a sync round
        self._last_sync: bool | None = None  # the kind of the last speculative round
        self.tuner = DepthTuner(config.lookahead, pinned=config.tree_depth)
        self.prefill_lend_tokens = config.prefill_lend_tokens
        self._last_mode: RoundMode | None = None
        self._modes_seen: set[RoundMode] = set()  # a mode's first round pays one-time costs

    # ------------------------------------------------------------ decisions
    def plan(self, reqs: Sequence[Any]) -> RoundMode:
        """The mode of the next decode round of `reqs` (SGLang `Req`s, batch order; >= 1).

        Raises:
            ValueError: on an empty batch (`RoundModePolicy.choose`).
        """
        return self.round_mode.choose(
            [_tokens_left(req) for req in reqs], [request_accept_length(req) for req in reqs]
        )

    def plan_round(self, reqs: Sequence[Any], client: DraftSource) -> RoundPlan:
        """The next decode round of `reqs` (SGLang `Req`s, batch order; >= 1): its mode
        (`plan`) and, when it speculates, `client`'s drafts for the Step it shapes (the
        speculator's, or the client's own n-gram drafts after a timeout or fault); a plain
        round has none."""
        mode = self.plan(reqs)
        if mode == RoundMode.PLAIN:
            return RoundPlan(mode, DraftBatch.plain(len(reqs)))
        self._sync_round = not self.sync and self.sync_rounds.choose(len(reqs))
        return RoundPlan(mode, client.drafts(reqs, self), sync=self._sync_round)

    def step(self, batch_size: int) -> StepChoice:
        """The backup and D of the Step the client sends now for `batch_size` (>= 1) requests.

        Asked only when a Step goes out (the tuner's choice moves its state, so a round served
        by the target's own drafts chooses nothing). Sync mode and sync rounds: JIT and no build.
        """
        if self.sync or self._sync_round:
            return StepChoice(backup=draft_kinds.JIT, tree_depth=0, prespeculate=False)
        backup = self.policy.choose(batch_size)
        return StepChoice(backup=backup.value, tree_depth=self._choose_depth(batch_size, backup))

    def _choose_depth(self, batch_size: int, backup: Backup) -> int:
        """D for the build after this Step (`DepthTuner.choose` on the policy's live figures)."""
        policy = self.policy
        # A backup without stats yet is costed as the first fast backup (n-gram).
        fast = Backup(draft_kinds.fast_backup_names()[0])
        miss = policy.backups.get(backup) or policy.backups[fast]
        return self.tuner.choose(
            t_verify=policy.t_verify,
            p_hit=policy.p_hit,
            alpha_miss=miss.alpha,
            t_backup=miss.latency,
            batch_size=batch_size,
        )

    @property
    def tree_depth(self) -> int:
        """The D in force: the tuner's (self-tuned or pinned), 0 in sync mode (no builds)."""
        return 0 if self.sync else self.tuner.depth

    def prefill_lends_cores(self, new_tokens: int) -> bool:
        """Whether a prefill forward of `new_tokens` (the batch's uncached input tokens) runs on
        the speculator's cores too: while plain rounds are the mode in use (the speculator is
        idle then), or when it has at least `--ssd-prefill-lend-tokens`: the speculator is
        stopped meanwhile and prefills the draft after it, so the first round may wait for that,
        but on the 2-core CPU the target's prefill halves (a 246-token prompt: 3.1 s → 1.8 s)
        while the 0.5B int8 draft's takes a quarter of it (0.8 s)."""
        lend = self.prefill_lend_tokens
        return self.round_mode.plain_now or (lend > 0 and new_tokens >= lend)

    @property
    def plain_rounds(self) -> int:
        """Plain rounds chosen since start."""
        return self.round_mode.rounds[RoundMode.PLAIN]

    @property
    def sync_rounds_run(self) -> int:
        """Sync rounds chosen since start (`--ssd-sync-rounds`; none under `--ssd-mode sync`,
        whose rounds are all drafted just in time already: `plan_round` asks no policy)."""
        return self.sync_rounds.rounds[SYNC]

    # ------------------------------------------------------------ measurements
    def observe_build(self, timing: SpeculatorTiming) -> None:
        """The speculator's work behind the Drafts just received (feeds the depth tuner)."""
        self.tuner.observe_build(timing.phases, timing.forwards, timing.build_forwards)

    def observe_outcomes(
        self,
        drafts: DraftBatch,
        accept_lens: Sequence[int],
        verify_s: float | None,
        timing: SpeculatorTiming | None,
        sync: bool = False,
    ) -> None:
        """Fold a speculative round into the policy's moving averages and the tuner's counts.

        Args:
            drafts: the round's drafts (their `sources`, and `depth` of the cache hits).
            accept_lens: k per request, batch order (>= 1 request).
            verify_s: the target's verify forward in seconds (None or 0: not measured).
            timing: the latest usable Drafts' timing (its build and backup seconds), None
                before any arrived.
            sync: a sync round (no pre-speculation before it, the verify on lent cores): its
                hit rate, verify time and build say nothing of pre-speculated rounds, so only
                its backups' acceptance and latency are folded in.
        """
        by_source: dict[str, list[int]] = {}
        hit_depths: list[int] = []  # the draft depth of each cache hit, in `hits` order
        depths = drafts.depth.tolist()
        for source, depth, k in zip(drafts.sources, depths, accept_lens, strict=True):
            by_source.setdefault(source, []).append(k + 1)
            if source == draft_kinds.CACHE:
                hit_depths.append(int(depth))
        hits = by_source.get(draft_kinds.CACHE, [])
        self.tuner.observe_hits([n - 1 for n in hits], hit_depths)
        if not sync:
            self.policy.observe(
                hit_rate=len(hits) / len(accept_lens),
                t_verify=verify_s if verify_s else None,
                t_spec=None if timing is None else timing.build_s,
            )
        # Hits carry D <= γ tokens: α from the tuner's depth-aware counts, not E(α) = L at γ.
        self.policy.alpha_hit = self.tuner.alpha
        # The Step's backup seconds are the just-in-time drafts' when the round has any (a
        # request still prefilling gets an n-gram draft beside them, in microseconds).
        has_jit = draft_kinds.JIT in by_source
        for source in draft_kinds.backup_names():
            lengths = by_source.get(source)
            if lengths:
                timed = timing is not None and (source == draft_kinds.JIT or not has_jit)
                self.policy.observe(
                    backup=Backup(source),
                    accept_length_backup=sum(lengths) / len(lengths),
                    t_backup=timing.backup_s if timed else None,
                )

    def close_round(
        self,
        client: DraftSource,
        reqs: Sequence[Any],
        plan: RoundPlan,
        outcome: tuple[list[int], list[int]],
        verify_s: float,
        round_s: float,
    ) -> None:
        """A verified decode round of `reqs` (batch order), planned as `plan`.

        A speculative round's outcomes go to `client` (sent with the next Step; a plain
        round's tokens reach the speculator as `Outcome.extra` instead) and into the policy's
        and tuner's measurements (`observe_outcomes`), and each request's L_r. The round's wall
        time goes to `RoundModePolicy` (and a speculative round's, with its tokens, to
        `SyncRoundPolicy`), except a speculative round's right after plain ones (it pays the
        switch: a cold cache), one whose kind (sync or not) differs from the speculative round
        before it (an async round after a sync one has a cold cache, a sync round after an
        async one may hit the cache built before it) and each mode's and kind's first round
        since start (one-time costs; nor does such a round's accept length count).

        Args:
            outcome: (k, bonus token) per request, batch order.
            verify_s: the verify batch's build and forward in seconds.
            round_s: the round's wall time in seconds (scheduler time before it included).
        """
        accept_lens, bonus = outcome
        cold = plan.mode == RoundMode.SPECULATE and self._last_mode == RoundMode.PLAIN
        # A mode's first round since start (the startup warm-up's, usually) pays one-time
        # costs: a first speculative round took 1.8 s at batch 1 against 0.45 s later.
        first = plan.mode not in self._modes_seen
        self._modes_seen.add(plan.mode)
        self._last_mode = plan.mode
        if not reqs or plan.mode != RoundMode.SPECULATE:
            if reqs and not first:
                self.round_mode.observe(plan.mode, len(reqs), round_s)
            return
        client.record_outcomes([req.rid for req in reqs], accept_lens, bonus)
        self.observe_outcomes(
            plan.drafts, accept_lens, verify_s, client.last_timing, sync=plan.sync
        )
        # A kind's first round since start is also a change of kind (from None, or from the
        # only other kind): one test covers both.
        kind_changed = plan.sync != self._last_sync
        self._last_sync = plan.sync
        if cold or first or kind_changed:
            return
        mean_tokens = 1.0 + sum(accept_lens) / len(reqs)
        self.sync_rounds.observe(plan.sync, len(reqs), round_s, mean_tokens)
        self.round_mode.observe(plan.mode, len(reqs), round_s)
        self.round_mode.observe_accept(len(reqs), mean_tokens)
        for req, k in zip(reqs, accept_lens, strict=True):
            record_request_tokens(req, k + 1)

    # ------------------------------------------------------------ live settings
    def apply(self, changes: Mapping[str, Any], config: SSDConfig) -> None:
        """Live `changes` (already in `config`, the settings now in force) that steer the
        planner: a pinned or self-tuned D, the plain-rounds and sync-rounds settings, the
        backup mode, the prefill size that lends the speculator's cores."""
        if "tree_depth" in changes:  # 0 self-tunes again (the config holds None)
            self.tuner.pin(config.tree_depth)
        if "plain_rounds" in changes:
            self.round_mode.setting = changes["plain_rounds"]
        if "sync_rounds" in changes:
            self.sync_rounds.setting = changes["sync_rounds"]
        if "prefill_lend_tokens" in changes:
            self.prefill_lend_tokens = config.prefill_lend_tokens
        if "backup" in changes:
            self.policy.mode = Backup(changes["backup"]) if changes["backup"] != "auto" else "auto"

    def stats(self) -> dict[str, float | int | bool]:
        """For `/ssd/stats`' `speculator`: the tuner's figures, the D in force and the round
        modes and kinds chosen (`RoundModePolicy.stats`, `SyncRoundPolicy.stats`); counts are
        ints."""
        return {
            **self.tuner.stats(),
            "tree_depth": self.tree_depth,
            **self.round_mode.stats(),
            **self.sync_rounds.stats(),
        }


def _tokens_left(req: Any) -> int:
    """Tokens the request may still generate (its max_new_tokens minus its output so far)."""
    limit = req.sampling_params.max_new_tokens
    return ALL_TOKENS_LEFT if limit is None else int(limit) - len(req.output_ids)

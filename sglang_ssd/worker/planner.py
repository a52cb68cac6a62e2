"""What each decode round does, decided on the target side: `RoundPlanner`.

`SSDWorker` asks the planner once per round for the round's arrangement of the cores (async,
sync or plain: `ArrangementPolicy`, from measured rates per batch-size bucket) and whether a
prefill runs on the speculator's cores too (`prefill_lends_cores`); in a speculative round the
speculator client asks it for the Step's backup (`FallbackPolicy`, the cache-miss option for
this batch size) and tree depth D (`DepthTuner`) when it sends the Step. The planner learns
from what the round measured: the speculator's build timings as Drafts arrive, then the
verified outcomes, then the round's wall time. It holds no link, no process and no request
state (those are `speculator_client` and `core_lending`), so it is tested without a process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sglang_ssd.config import CYCLE_ENV, SSDConfig
from sglang_ssd.saguaro import Backup, BackupStats, FallbackPolicy, draft_kinds
from sglang_ssd.saguaro.self_tuning import DepthTuner
from sglang_ssd.transport import SpeculatorTiming
from sglang_ssd.worker.arrangement_policy import ArrangementPolicy
from sglang_ssd.worker.draft_batch import DraftBatch
from sglang_ssd.worker.metrics import snapshot
from sglang_ssd.worker.round_mode import Arrangement, offered
from sglang_ssd.worker.tp_sync import RoundPlan

ALL_TOKENS_LEFT = 1 << 30  # tokens left of a request without max_new_tokens
# A prefill of at least this many new tokens runs on the speculator's cores too while async is
# held (the speculator is stopped meanwhile and prefills the draft after it): the size measured
# best (docs/benchmarks.md, "Lending the speculator's core to long prefills"). Under sync or
# plain the speculator is idle between rounds, so every prefill does.
PREFILL_LEND_TOKENS = 128
# A request's first decode rounds rate no arrangement: the speculator may still be feeding its
# prompt (n-gram drafts meanwhile), and a short request (SGLang's 8-token startup warm-up) is
# not the text the server serves.
WARM_ROUNDS = 2


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
    `tree_depth` D of the build after it (0 in a sync round) and whether that build runs
    (`prespeculate`: False in a sync round, drafted just in time on every core)."""

    backup: str
    tree_depth: int
    prespeculate: bool = True


class RoundPlanner:
    """The round's decisions and the measurements they rest on (see the module docstring).

    Attributes:
        policy: the cache-miss policy (`/ssd/stats`' `fallback` reads it).
        arrangements: each round's arrangement (`--ssd-mode`, live).
        tuner: D per build: self-tuned unless `--ssd-tree-depth` (or `POST /ssd/config`) pins it.

    Args:
        config: the settings in force.
        target_device: where the target runs ("cpu", "cuda:N"): what `auto` offers there.

    Raises:
        ValueError: on a mode the device cannot serve (`round_mode.mode_refusal`).
    """

    def __init__(self, config: SSDConfig, target_device: str = "cpu") -> None:
        self.target_device = target_device
        self.policy = default_policy(config)
        self.arrangements = ArrangementPolicy(
            offered(config.mode, target_device), cycle=os.environ.get(CYCLE_ENV) == "1"
        )
        self._arrangement = Arrangement.ASYNC  # of the round being planned
        self._lookahead = config.lookahead
        self._full_chain = True  # every request of that round could take γ + 1 tokens
        self.tuner = DepthTuner(config.lookahead, pinned=config.tree_depth)

    # ------------------------------------------------------------ decisions
    def plan(self, reqs: Sequence[Any]) -> Arrangement:
        """The arrangement of the next decode round of `reqs` (SGLang `Req`s, batch order).

        Raises:
            ValueError: on an empty batch.
        """
        if not reqs:
            raise ValueError("a decode round needs at least one request")
        left = [_tokens_left(req) for req in reqs]
        self._full_chain = min(left) > self._lookahead
        return self.arrangements.choose(len(reqs), max(left))

    def plan_round(self, reqs: Sequence[Any], client: DraftSource) -> RoundPlan:
        """The next decode round of `reqs` (SGLang `Req`s, batch order; >= 1): its arrangement
        (`plan`) and, when it speculates, `client`'s drafts for the Step it shapes (the
        speculator's, or the client's own n-gram drafts after a timeout or fault); a plain
        round has none."""
        self._arrangement = arrangement = self.plan(reqs)
        if arrangement == Arrangement.PLAIN:
            return RoundPlan(arrangement, DraftBatch.plain(len(reqs)))
        return RoundPlan(arrangement, client.drafts(reqs, self))

    def step(self, batch_size: int) -> StepChoice:
        """The backup and D of the Step the client sends now for `batch_size` (>= 1) requests.

        Asked only when a Step goes out (the tuner's choice moves its state, so a round served
        by the target's own drafts chooses nothing). A sync round: JIT and no build.
        """
        if self._arrangement == Arrangement.SYNC:
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
        """The D in force: the tuner's (self-tuned or pinned); 0 while only sync is offered
        (no builds)."""
        return 0 if self.arrangements.offered == (Arrangement.SYNC,) else self.tuner.depth

    def held(self, batch_size: int) -> Arrangement | None:
        """The arrangement held at `batch_size`'s bucket (None while it calibrates)."""
        return self.arrangements.held(batch_size)

    def prespeculates(self, batch_size: int) -> bool:
        """Whether requests prefilled in a batch of `batch_size` get their first round
        pre-speculated: unless the round after the prefill will be sync (sync alone offered,
        or held at that batch size), whose draft is just in time."""
        if self.arrangements.offered == (Arrangement.SYNC,):
            return False
        return self.arrangements.held(max(batch_size, 1)) != Arrangement.SYNC

    def prefill_lends_cores(self, new_tokens: int, batch_size: int) -> bool:
        """Whether a prefill forward of `new_tokens` (the batch's uncached input tokens) for
        `batch_size` requests runs on the speculator's cores too: when the arrangement held at
        that batch size is not async (the speculator idles between rounds then), or the
        prefill has at least `PREFILL_LEND_TOKENS` (the speculator is stopped meanwhile and
        prefills the draft after it: on the 2-core CPU the target's prefill halves, a
        246-token prompt 3.1 s → 1.8 s, while the 0.5B int8 draft's takes a quarter of it)."""
        held = self.arrangements.held(max(batch_size, 1))
        if self.arrangements.offered == (Arrangement.ASYNC,) or held == Arrangement.ASYNC:
            return new_tokens >= PREFILL_LEND_TOKENS
        return True

    @property
    def plain_rounds(self) -> int:
        """Plain rounds chosen since start."""
        return self.arrangements.rounds[Arrangement.PLAIN]

    @property
    def sync_rounds_run(self) -> int:
        """Sync rounds chosen since start."""
        return self.arrangements.rounds[Arrangement.SYNC]

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
            sync: a sync round (no pre-speculation before it, the verify on every core): its
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
        and tuner's measurements (`observe_outcomes`). The round's wall time and tokens per
        request go to the `ArrangementPolicy` (which skips switches and first rounds, and does
        not rate a round where a request had γ or fewer tokens left: its limit, not the
        arrangement, capped the tokens).

        Args:
            outcome: (k, bonus token) per request, batch order.
            verify_s: the verify batch's build and forward in seconds.
            round_s: the round's wall time in seconds (scheduler time before it included).
        """
        if not reqs:
            return
        accept_lens, bonus = outcome
        if plan.arrangement != Arrangement.PLAIN:
            client.record_outcomes([req.rid for req in reqs], accept_lens, bonus)
            self.observe_outcomes(
                plan.drafts, accept_lens, verify_s, client.last_timing, sync=plan.sync
            )
        if round_s > 0:
            started = min(sum(snapshot(req).values()) for req in reqs) >= WARM_ROUNDS
            self.arrangements.observe(
                plan.arrangement,
                len(reqs),
                round_s,
                [k + 1 for k in accept_lens],
                plan.drafts.sources,
                rated=self._full_chain and started,
            )

    # ------------------------------------------------------------ live settings
    def apply(self, changes: Mapping[str, Any], config: SSDConfig) -> None:
        """Live `changes` (already in `config`, the settings now in force) that steer the
        planner: a pinned or self-tuned D, the mode (what measured so far is kept), the backup.

        Raises:
            ValueError: a mode the target's device cannot serve (`round_mode.mode_refusal`).
        """
        if "mode" in changes:
            self.arrangements.offered = offered(config.mode, self.target_device)
        if "tree_depth" in changes:  # 0 self-tunes again (the config holds None)
            self.tuner.pin(config.tree_depth)
        if "backup" in changes:
            self.policy.mode = Backup(changes["backup"]) if changes["backup"] != "auto" else "auto"

    def stats(self) -> dict[str, float | int | bool]:
        """For `/ssd/stats`' `speculator`: the tuner's figures, the D in force and the rounds by
        arrangement (`ArrangementPolicy.stats`); counts are ints."""
        return {**self.tuner.stats(), "tree_depth": self.tree_depth, **self.arrangements.stats()}

    def describe(self) -> str:
        """The arrangement held and the rates behind it per measured bucket, for the decode
        log line ("b<=1: sync (sync 7.60 tok/s = 3.40 / 0.447 s, ...)"; "" before any)."""
        return "; ".join(self.arrangements.describe(int(b)) for b in self.arrangements.buckets())


def _tokens_left(req: Any) -> int:
    """Tokens the request may still generate (its max_new_tokens minus its output so far)."""
    limit = req.sampling_params.max_new_tokens
    return ALL_TOKENS_LEFT if limit is None else int(limit) - len(req.output_ids)

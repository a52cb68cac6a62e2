"""The target's requests and rounds over the link to the speculator: request sync, Step/Drafts,
outcomes, and the admin messages.

Each decode round `drafts(reqs)` (1) opens requests the speculator does not know yet (or whose
tokens drifted, e.g. after a retraction) with their full token list, (2) sends one `Step` with
the previous round's outcomes, the batch's rids and the backup `FallbackPolicy` picked for this
batch size, and (3) waits at most `--ssd-speculator-timeout` for the drafts. Any fault (timeout,
dead or stopped process, transport error) goes to the `Supervisor`, which kills the speculator
and restarts it in the background; the target keeps serving with its own n-gram drafts meanwhile
(DESIGN.md §1).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from sglang_ssd.config import SSDConfig, SSDConfigError, TargetCapacity
from sglang_ssd.phases import PhaseTimer
from sglang_ssd.placement import TargetGpus, place
from sglang_ssd.saguaro import Backup, BackupStats, FallbackPolicy, draft_kinds
from sglang_ssd.saguaro.sampling import TOP_K_ALL
from sglang_ssd.saguaro.self_tuning import DepthTuner
from sglang_ssd.transport import (
    Close,
    Configure,
    ConfigureAck,
    DraftSource,
    Open,
    Outcome,
    ReceivedDrafts,
    RemoteError,
    SamplingSpec,
    StatsReply,
    StatsRequest,
    Step,
    TargetLink,
    TransportError,
)
from sglang_ssd.worker.core_lending import CoreLending
from sglang_ssd.worker.draft_batch import DraftBatch, dense_q
from sglang_ssd.worker.draft_provider import DraftSupplier, LocalNgramProvider, request_tokens
from sglang_ssd.worker.feature_buffer import FeatureBuffer
from sglang_ssd.worker.round_mode import RoundModePolicy, plain_rounds_refusal
from sglang_ssd.worker.supervisor import SpeculatorProcess, Supervisor

logger = logging.getLogger(__name__)

ALIVE_POLL_S = 0.25  # while waiting for drafts, how often to check the process is still there
STATS_TIMEOUT_S = 5.0


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


class SpeculatorClient:
    """The target's drafts from the speculator process (see the module docstring); a
    `DraftSupplier` that falls back to `LocalNgramProvider` while the speculator is down.

    The speculator's KV pool is sized from `capacity`, the target's (`SSDConfig.draft_kv_slots`,
    unless `--ssd-draft-kv-tokens` is given); `config.draft_kv_tokens` holds the size chosen.

    `target_device` is where the target verifies (q is laid out there); `vocab_size` its logit
    width; `gpus` the server's ranks (`placement.TargetGpus`; default: a lone target) and
    `dp_rank` the DP replica this client serves (default: found from the target's GPU; 0 on
    CPU), which places its speculator on the replica's own GPU or cores; `target_model_path`
    the target's folder (an EAGLE-3 head draft reads the target's embeddings there).

    Raises (constructor): `TransportError` if the speculator does not start; `ValueError` on an
    impossible placement (CPU split, or a speculator GPU that collides with the target's).
    """

    def __init__(
        self,
        config: SSDConfig,
        draft_model_path: str,
        target_device: str,
        vocab_size: int,
        capacity: TargetCapacity | None = None,
        gpus: TargetGpus | None = None,
        dp_rank: int | None = None,
        target_model_path: str | None = None,
    ) -> None:
        self.capacity = capacity
        self.config = config.replace(draft_kv_tokens=config.draft_kv_slots(capacity))
        logger.info(
            "SSD: speculator KV pool of %d tokens (%s; target: %s)",
            self.config.draft_kv_tokens,
            "--ssd-draft-kv-tokens" if config.draft_kv_tokens else "sized from the target",
            capacity,
        )
        self.vocab_size = vocab_size
        self.target_device = torch.device(target_device)
        self.local: DraftSupplier = LocalNgramProvider(config.lookahead)
        self.policy = default_policy(config)
        self.round_mode = RoundModePolicy(config.plain_rounds)
        # D per build: self-tuned unless --ssd-tree-depth (or POST /ssd/config) pins it.
        self.tuner = DepthTuner(config.lookahead, pinned=config.tree_depth)
        self.opened: dict[str, int] = {}  # rid -> committed tokens the speculator holds
        self.pending: dict[str, tuple[int, int]] = {}  # rid -> (k, bonus) not yet reported
        self.last_sources: dict[str, str] = {}
        self.last_depths: dict[str, int] = {}  # rid -> tokens of its draft this round
        self.step_id = 0
        self.decode_rounds = 0
        self.last_seen: dict[str, int] = {}  # rid -> decode round it was last prefilled/decoded
        self.last_timing: dict[str, float] = {}
        # An EAGLE-3 head draft's target features, from the forwards to the next Step.
        self.features = FeatureBuffer()
        # The speculator's seconds by phase, summed over the Drafts it sent (`/ssd/stats`).
        self.speculator_phases = PhaseTimer()
        self.drafts_received = 0
        # Draft forwards since start, in all and of pre-speculation builds (speedup model).
        self.draft_forwards = 0
        self.build_draft_forwards = 0
        self._lock = threading.Lock()
        placement = place(config, target_device, gpus, dp_rank)
        self.lending = CoreLending(placement.target_cpus, placement.cpus or ())
        self.supervisor = Supervisor(
            lambda: self.config,  # a restarted speculator starts from the live settings
            draft_model_path,
            placement,
            self._lock,
            self._forget,
            target_vocab_size=vocab_size,
            target_model_path=target_model_path,
            target_device=self.target_device,
        )
        self.supervisor.start()

    # ------------------------------------------------------------ the linked speculator
    @property
    def link(self) -> TargetLink | None:
        """The live link, None while the speculator is down."""
        return self.supervisor.link

    @property
    def process(self) -> SpeculatorProcess | None:
        return self.supervisor.process

    @property
    def faults(self) -> int:
        return self.supervisor.faults

    @property
    def restarts(self) -> int:
        return self.supervisor.restarts

    def _forget(self) -> None:
        """The linked speculator changed: it holds none of our requests."""
        self.opened.clear()
        self.pending.clear()
        self.features.clear()

    def _usable(self) -> bool:
        return self.supervisor.usable()

    def _fault(self, reason: str) -> None:
        self.supervisor.fault(reason)

    # ------------------------------------------------------------ drafts and outcomes
    def drafts(self, reqs: Sequence[Any]) -> DraftBatch:
        """Drafts for `reqs` (SGLang `Req`s, batch order); the speculator's, else local n-gram
        drafts. Carries the previous round's outcomes to the speculator."""
        with self._lock:
            if self._usable():
                try:
                    return self._remote_drafts(reqs)
                except (TransportError, RemoteError) as exc:
                    self._fault(f"{type(exc).__name__}: {exc}")
            self.last_sources = {}
            return self.local.drafts(reqs)

    def prepare(self, reqs: Sequence[Any]) -> None:
        """Open requests entering prefill, so the speculator prefills their prompts while the
        target does (their first sampled token then arrives as an outcome with k = 0). A request
        that ends at its prefill (`max_new_tokens` <= 1: the prefix copy SGLang prefills for
        `n > 1` with `max_new_tokens` 0) is never opened: it has no round to draft."""
        with self._lock:
            if not self._usable():
                return
            try:
                for req in reqs:
                    if _ends_at_prefill(req):
                        continue
                    if req.rid not in self.opened:
                        prompt = list(req.origin_input_ids)
                        self.link.send(
                            Open(
                                rid=req.rid,
                                token_ids=prompt,
                                sampling=_sampling_spec(req),
                                prespeculate=self.config.mode == "async",
                            )
                        )
                        self.opened[req.rid] = len(prompt)
                    self.last_seen[req.rid] = self.decode_rounds
            except TransportError as exc:
                self._fault(f"open: {exc}")

    def _sweep(self, reqs: Sequence[Any]) -> None:
        """Close requests that left without a finish notice (finished at prefill, aborted in
        the queue, retracted): absent from this decode batch and from the last extend."""
        self.decode_rounds += 1
        for req in reqs:
            self.last_seen[req.rid] = self.decode_rounds
        for rid, seen in list(self.last_seen.items()):
            if seen < self.decode_rounds - 1:
                del self.last_seen[rid]
                self.pending.pop(rid, None)
                self.features.drop(rid)
                if self.opened.pop(rid, None) is not None and self.link is not None:
                    self.link.send(Close(rid=rid))

    def _remote_drafts(self, reqs: Sequence[Any]) -> DraftBatch:
        link = self.link
        self._sweep(reqs)
        outcomes = []
        for req in reqs:
            tokens = request_tokens(req)
            known = self.opened.get(req.rid)
            outcome = outcome_since(req.rid, tokens, known, self.pending.pop(req.rid, None))
            if outcome is not None:
                outcomes.append(outcome)
            elif known != len(tokens):
                if known is not None:
                    link.send(Close(rid=req.rid))
                self.features.keep_from_start(req.rid)
                link.send(Open(rid=req.rid, token_ids=tokens, sampling=_sampling_spec(req)))
            self.opened[req.rid] = len(tokens)
        backup = "jit" if self.config.mode == "sync" else self.policy.choose(len(reqs)).value
        self.step_id += 1
        rids = [req.rid for req in reqs]
        depth = self._choose_depth(len(reqs), Backup(backup))
        spans, features = self.features.take(rids)
        link.send_step(
            Step(
                step_id=self.step_id,
                outcomes=outcomes,
                requests=rids,
                backup=backup,
                tree_depth=depth,
                features=spans,
                feature_size=0 if features is None else int(features.shape[1]),
                feature_dtype=_feature_dtype(features),
            ),
            features=features,
        )
        got = self._wait_drafts(link)
        timing = got[0].timing
        self.tuner.observe_build(timing.phases, timing.forwards, timing.build_forwards)
        return self._to_batch(reqs, got)

    @property
    def tree_depth(self) -> int:
        """The D in force: the tuner's (self-tuned or pinned), 0 in sync mode (no builds)."""
        return 0 if self.config.mode == "sync" else self.tuner.depth

    def _choose_depth(self, batch_size: int, backup: Backup) -> int:
        """D for the build after this Step (`DepthTuner.choose` on the policy's live figures);
        0 in sync mode, which builds nothing."""
        if self.config.mode == "sync":
            return 0
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

    def _wait_drafts(self, link: TargetLink) -> ReceivedDrafts:
        """The reply to the outstanding Step, waiting at most `--ssd-speculator-timeout` and
        checking the process between short polls (a killed speculator is found at once)."""
        timeout = self.config.speculator_timeout
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            got = link.recv_drafts(self.step_id, max(min(ALIVE_POLL_S, left), 0.0))
            if got is not None:
                return got
            if self.process is None or not self.process.alive():
                raise TransportError("the speculator process exited while drafting")
            if left <= ALIVE_POLL_S:
                raise TransportError(f"no drafts within {timeout} s")

    def _to_batch(self, reqs: Sequence[Any], got: ReceivedDrafts) -> DraftBatch:
        msg, tokens, q = got
        depth = torch.tensor([e.depth for e in msg.entries], dtype=torch.int64)
        has_q = torch.tensor([e.has_q for e in msg.entries], dtype=torch.bool)
        sources = [e.source for e in msg.entries]
        # Over NCCL the tensors arrive on the target's GPU; tokens are small bookkeeping
        # (CPU), q goes where the target verifies (`dense_q`). A device or shape surprise
        # here is the speculator's fault, not the scheduler's: TransportError, so that the
        # supervisor restarts the speculator and this round is served by target-side drafts.
        try:
            tokens = tokens.cpu()
            dense = None if q is None else dense_q(q, has_q, self.vocab_size, self.target_device)
            if dense is not None and dense.shape[1] != tokens.shape[1]:
                raise ValueError(f"q depth {dense.shape[1]} != draft depth {tokens.shape[1]}")
            if tokens.numel() and int(tokens.max()) >= self.vocab_size:
                raise ValueError(f"a draft token is outside the target's {self.vocab_size} ids")
        except (RuntimeError, ValueError) as exc:
            raise TransportError(f"unusable drafts from the speculator: {exc}") from exc
        missing = [i for i, e in enumerate(msg.entries) if e.source == DraftSource.MISSING]
        if missing:
            local = self.local.drafts([reqs[i] for i in missing])
            width = max(tokens.shape[1], local.tokens.shape[1])
            tokens = torch.nn.functional.pad(tokens, (0, width - tokens.shape[1]), value=-1)
            if dense is not None:
                dense = torch.nn.functional.pad(dense, (0, 0, 0, width - dense.shape[1]))
            for j, i in enumerate(missing):
                tokens[i] = -1
                tokens[i, : local.tokens.shape[1]] = local.tokens[j]
                depth[i] = local.depth[j]
                sources[i] = draft_kinds.LOCAL_NGRAM
                self.opened.pop(reqs[i].rid, None)
        timing = msg.timing
        self.last_timing = {"build_s": timing.build_s, "backup_s": timing.backup_s}
        self.speculator_phases.merge(timing.phases)
        self.drafts_received += 1
        self.draft_forwards += timing.forwards
        self.build_draft_forwards += timing.build_forwards
        self.last_sources = {req.rid: s for req, s in zip(reqs, sources, strict=True)}
        self.last_depths = {req.rid: int(d) for req, d in zip(reqs, depth.tolist(), strict=True)}
        return DraftBatch(tokens=tokens, depth=depth, q=dense, has_q=has_q, sources=sources)

    @contextlib.contextmanager
    def cores_lent(self) -> Iterator[None]:
        """For a plain round's forward: the speculator stopped and its CPU cores lent to the
        target (`CoreLending`), under the client's lock so that no admin request waits on a
        stopped speculator. The tokens the round commits reach the speculator with the next
        Step's outcomes (`Outcome.extra`)."""
        with self._lock:
            process = self.process
            pid = process.pid if process is not None and process.alive() else None
            with self.lending.lent(pid):
                yield

    def record_outcomes(
        self,
        rids: Sequence[str],
        accept_lens: list[int],
        bonus: list[int],
        verify_s: float | None = None,
    ) -> None:
        """The verified outcome (k, t*) of each request this round (sent with the next Step);
        `verify_s` is the target's verify forward time in seconds (feeds the fallback policy)."""
        for rid, k, t in zip(rids, accept_lens, bonus, strict=True):
            if rid in self.opened:
                self.pending[rid] = (k, t)
        if rids:
            self._observe(rids, accept_lens, verify_s)

    def _observe(self, rids: Sequence[str], accept_lens: list[int], verify_s: float | None) -> None:
        """Feed the round's measurements into `FallbackPolicy`'s moving averages."""
        by_source: dict[str, list[int]] = {}
        hit_depths: list[int] = []  # the draft depth of each cache hit, in `hits` order
        for rid, k in zip(rids, accept_lens, strict=True):
            source = self.last_sources.get(rid, draft_kinds.LOCAL_NGRAM)
            by_source.setdefault(source, []).append(k + 1)
            if source == draft_kinds.CACHE:
                hit_depths.append(self.last_depths.get(rid, 0))
        hits = by_source.get(draft_kinds.CACHE, [])
        self.tuner.observe_hits([n - 1 for n in hits], hit_depths)
        self.policy.observe(
            hit_rate=len(hits) / len(rids),
            t_verify=verify_s if verify_s else None,
            t_spec=self.last_timing.get("build_s"),
        )
        # Hits carry D <= γ tokens: α from the tuner's depth-aware counts, not E(α) = L at γ.
        self.policy.alpha_hit = self.tuner.alpha
        for source in draft_kinds.backup_names():
            lengths = by_source.get(source)
            if lengths:
                self.policy.observe(
                    backup=Backup(source),
                    accept_length_backup=sum(lengths) / len(lengths),
                    t_backup=self.last_timing.get("backup_s"),
                )

    def add_features(self, rids: Sequence[str], rows: Sequence[tuple[int, torch.Tensor]]) -> None:
        """The target's EAGLE-3 features of a forward: per request of `rids`, (first position,
        features [n, F]) (`feature_buffer.extend_features` / `verify_features`); they go to the
        speculator with the next Step that carries the request. Requests the speculator does
        not hold (it is down, or they were never opened) are skipped."""
        with self._lock:
            for rid, (start, feats) in zip(rids, rows, strict=True):
                if rid in self.opened:
                    self.features.add(rid, start, feats)

    def close(self, rid: str) -> None:
        """The request finished or was aborted."""
        with self._lock:
            self.pending.pop(rid, None)
            self.features.drop(rid)
            self.last_seen.pop(rid, None)
            if self.opened.pop(rid, None) is not None and self._usable():
                try:
                    self.link.send(Close(rid=rid))
                except TransportError as exc:
                    self._fault(f"close: {exc}")

    def reset(self) -> None:
        """Forget all requests (SGLang flushed its caches)."""
        for rid in list(self.opened):
            self.close(rid)

    # ------------------------------------------------------------ admin
    def configure(self, request: Configure) -> ConfigureAck | None:
        """Apply `request.changes` between rounds (the admin endpoint) and tell the speculator.

        Returns:
            The speculator's acknowledgement (every live setting in force), or None when none
            acknowledged (none running, a fault, no answer within the timeout): the target then
            applied the changes alone, and a restarted speculator starts from `self.config`.

        Raises:
            SSDConfigError: a change `SSDConfig` refuses, or a fan-out budget above what the
                speculator's KV pool and one round's outcomes can hold (then nothing changes).
        """
        changes = request.changes.given()
        refusal = plain_rounds_refusal(changes.get("plain_rounds", "never"), self.target_device)
        if refusal is not None:
            raise SSDConfigError(refusal)
        with self._lock:
            if "fanout_budget" in changes:
                longest = self.capacity.longest_request if self.capacity is not None else 0
                self.config.check_fanout_budget(changes["fanout_budget"], longest, self.vocab_size)
            self.config = self.config.replace(**changes)
            if "tree_depth" in changes:  # 0 self-tunes again (the config holds None)
                self.tuner.pin(self.config.tree_depth)
            if "plain_rounds" in changes:
                self.round_mode.setting = changes["plain_rounds"]
            if "backup" in changes:
                self.policy.mode = (
                    Backup(changes["backup"]) if changes["backup"] != "auto" else "auto"
                )
            if not self._usable():
                return None
            try:
                self.link.send(request)
                return self.link.recv_reply(ConfigureAck, self.config.speculator_timeout)
            except TransportError as exc:  # RemoteError included
                self._fault(f"configure: {exc}")
                return None

    def stats(self) -> dict[str, float]:
        """The speculator's counters (its open requests, KV slots used and total, rounds the
        pool degraded: `kv_exhausted`, ...) plus the client's: faults, restarts, the requests it
        tracks (`target_opened`, `target_pending`, `target_tracked`), the pool size it chose
        (`draft_kv_tokens`) and, since start, the drafts received, the draft forwards in all and
        of builds, and the speculator's seconds by phase (`phase_s_<phase>`)."""
        out: dict[str, float] = {}
        with self._lock:
            if self._usable():
                try:
                    self.link.send(StatsRequest())
                    reply = self.link.recv_reply(StatsReply, STATS_TIMEOUT_S)
                    if reply is not None:
                        out.update(reply.counters)
                    else:  # busy or hung: a hang is caught by the next round's timeout
                        logger.warning(
                            "SSD: no stats from the speculator in %.0f s", STATS_TIMEOUT_S
                        )
                except TransportError as exc:
                    self._fault(f"stats: {exc}")
            out.update(
                faults=self.faults,
                restarts=self.restarts,
                speculator_up=float(self.link is not None),
                # The target's own per-request bookkeeping (leak checks under load).
                target_opened=len(self.opened),
                target_pending=len(self.pending),
                target_tracked=len(self.last_seen),
                target_features_buffered=len(self.features),
                draft_kv_tokens=float(self.config.draft_kv_tokens or 0),
                drafts_received=float(self.drafts_received),
                draft_forwards=float(self.draft_forwards),
                build_draft_forwards=float(self.build_draft_forwards),
            )
            phases = dict(self.speculator_phases.seconds)
            out.update({f"phase_s_{k}": v for k, v in sorted(phases.items())})
            out.update(self.tuner.stats(), tree_depth=float(self.tree_depth))
            out.update(self.round_mode.stats(), cores_lent=float(self.lending.lends))
            if self.process is not None:
                out["speculator_pid"] = float(self.process.pid)
        return out

    def shutdown(self) -> None:
        """Stop the speculator (and any restart in progress) for good; idempotent."""
        self.supervisor.stop()


def outcome_since(
    rid: str, tokens: Sequence[int], known: int | None, pending: tuple[int, int] | None
) -> Outcome | None:
    """What the speculator must learn about a request since the last Step that carried it.

    Args:
        rid: the request.
        tokens: all its tokens now (prompt + output).
        known: how many of them the speculator holds (None: it does not know the request).
        pending: (k, bonus) verified in its last speculative round, None if there was none
            since (a new request, or one whose round was not reported).

    Returns:
        The `Outcome`: k accepted draft tokens, the bonus, then as `extra` the tokens plain
        rounds committed since; or None when `tokens` do not continue what the speculator
        holds that way (the caller re-opens the request) or hold nothing new.
    """
    k, bonus = pending if pending is not None else (0, None)
    if known is None:
        return None
    at = known + k  # where the outcome's bonus sits in `tokens`
    if at >= len(tokens) or bonus not in (None, tokens[at]):
        return None
    return Outcome(rid=rid, accept_len=k, bonus=tokens[at], extra=list(tokens[at + 1 :]))


def _feature_dtype(features: torch.Tensor | None) -> str:
    """`Step.feature_dtype` of a features tensor (the default when there is none).

    Raises:
        ValueError: a dtype the protocol does not carry (bfloat16, float16, float32 only)."""
    if features is None:
        return "bfloat16"
    name = str(features.dtype).removeprefix("torch.")
    if name not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"target features of dtype {name}: the link carries 16/32-bit floats")
    return name


def _ends_at_prefill(req: Any) -> bool:
    """Whether the request finishes with the token its prefill samples (`max_new_tokens` <= 1),
    before any decode round."""
    limit = req.sampling_params.max_new_tokens
    return limit is not None and int(limit) <= 1


def _sampling_spec(req: Any) -> SamplingSpec:
    """The request's sampling options in the protocol's terms (greedy → top_k 1)."""
    sp = req.sampling_params
    top_k = int(sp.top_k)
    if top_k < 0 or top_k >= TOP_K_ALL:  # SGLang's "whole vocabulary": -1 on the wire
        top_k = -1
    seed = getattr(sp, "sampling_seed", None)
    return SamplingSpec(
        temperature=float(sp.temperature),
        top_k=top_k,
        top_p=float(sp.top_p),
        seed=None if seed is None else int(seed),
    )

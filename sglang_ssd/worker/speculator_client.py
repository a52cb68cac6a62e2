"""The target's requests and rounds over the link to the speculator: request sync, Step/Drafts.

Each decode round `drafts(reqs, planner)` (1) opens requests the speculator does not know yet (or
whose tokens drifted, e.g. after a retraction) with their full token list, (2) sends one `Step`
with the previous round's outcomes, the batch's rids and the backup and tree depth the round's
planner (`planner.RoundPlanner`) picks, and (3) waits for the drafts while the speculator makes
progress, at most `--ssd-speculator-timeout` without it. Any fault (timeout, dead or stopped
process, transport error) goes to the `Supervisor`, which kills the speculator and restarts it in
the background; the target keeps serving with its own n-gram drafts meanwhile
(docs/design.md#when-the-speculator-is-down).
The admin messages (live settings, counters) are `speculator_admin`'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.launch.placement import TargetGpus, place
from sglang_ssd.phases import PhaseTimer
from sglang_ssd.transport import (
    Close,
    ReceivedDrafts,
    RemoteError,
    SpeculatorTiming,
    TargetLink,
    TransportError,
)
from sglang_ssd.worker.draft_batch import DraftBatch
from sglang_ssd.worker.draft_provider import DraftSupplier, LocalNgramProvider, request_tokens
from sglang_ssd.worker.drafts_reply import reply_batch
from sglang_ssd.worker.feature_buffer import FeatureBuffer
from sglang_ssd.worker.request_messages import (
    ends_at_prefill,
    open_message,
    outcome_since,
    step_message,
)
from sglang_ssd.worker.supervisor import Supervisor

if TYPE_CHECKING:
    from sglang_ssd.worker.planner import RoundPlanner

ALIVE_POLL_S = 0.25  # while waiting for drafts, how often to check the process is still there
# CPU seconds the speculator must use between two checks to count as making progress (an idle
# speculator polling its socket uses well under a millisecond per check).
PROGRESS_CPU_S = 0.01
# However busy the speculator is, drafts later than this many `--ssd-speculator-timeout`s are a
# fault (a speculator spinning in a loop uses CPU without making progress).
HARD_TIMEOUT_FACTOR = 10


class SpeculatorClient:
    """The target's drafts from the speculator process (see the module docstring); falls back
    to `LocalNgramProvider` while the speculator is down.

    `config` holds the settings a (re)started speculator starts from (`speculator_admin`
    changes them live); `target_device` is where the target verifies (q is laid out there);
    `vocab_size` its logit width; `gpus` the server's ranks (`placement.TargetGpus`; default: a
    lone target) and `dp_rank` the DP replica this client serves (default: found from the
    target's GPU; 0 on CPU), which places its speculator on the replica's own GPU or cores;
    `target_model_path` the target's folder (an EAGLE-3 head draft reads its embeddings).

    Raises (constructor): `TransportError` if the speculator does not start; `ValueError` on an
    impossible placement (CPU split, or a speculator GPU that collides with the target's).
    """

    def __init__(
        self,
        config: SSDConfig,
        draft_model_path: str,
        target_device: str,
        vocab_size: int,
        gpus: TargetGpus | None = None,
        dp_rank: int | None = None,
        target_model_path: str | None = None,
    ) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self.target_device = torch.device(target_device)
        self.local: DraftSupplier = LocalNgramProvider(config.lookahead)
        self.opened: dict[str, int] = {}  # rid -> committed tokens the speculator holds
        self.pending: dict[str, tuple[int, int]] = {}  # rid -> (k, bonus) not yet reported
        self.step_id = self.decode_rounds = 0  # Steps sent; decode rounds seen
        self.last_seen: dict[str, int] = {}  # rid -> decode round it was last prefilled/decoded
        # An EAGLE-3 head draft's target features, from the forwards to the next Step.
        self.features = FeatureBuffer()
        # What the Drafts received since start carried: the speculator's seconds by phase, its
        # draft forwards in all and of pre-speculation builds, the latest usable Drafts' timing.
        self.speculator_phases = PhaseTimer()
        self.drafts_received = self.draft_forwards = self.build_draft_forwards = 0
        self.last_timing: SpeculatorTiming | None = None
        self.lock = threading.Lock()  # request state and link; admin requests take it too
        self.supervisor = Supervisor(
            lambda: self.config,  # a restarted speculator starts from the live settings
            draft_model_path,
            place(config, target_device, gpus, dp_rank),
            self.lock,
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

    def _forget(self) -> None:
        """The linked speculator changed: it holds none of our requests."""
        self.opened.clear()
        self.pending.clear()
        self.features.clear()

    # ------------------------------------------------------------ drafts and outcomes
    def drafts(self, reqs: Sequence[Any], planner: RoundPlanner) -> DraftBatch:
        """Drafts for `reqs` (SGLang `Req`s, batch order): the speculator's, for the backup
        and tree depth `planner.step` picks as the Step goes out, else local n-gram drafts.
        Carries the previous round's outcomes to the speculator."""
        with self.lock:
            if self.supervisor.usable():
                try:
                    return self._remote_drafts(reqs, planner)
                except (TransportError, RemoteError) as exc:
                    self.supervisor.fault(f"{type(exc).__name__}: {exc}")
            return self.local.drafts(reqs)

    def prepare(self, reqs: Sequence[Any], prespeculate: bool | None = None) -> None:
        """Open requests entering prefill, so the speculator prefills their prompts while the
        target does (their first sampled token then arrives as an outcome with k = 0) and, with
        `prespeculate` (None: unless `--ssd-mode sync`), pre-speculates their first round after
        it. A request that ends at its prefill (`max_new_tokens` <= 1: the prefix copy SGLang
        prefills for `n > 1` with `max_new_tokens` 0) is never opened: it has no round to
        draft."""
        if prespeculate is None:
            prespeculate = self.config.mode != "sync"
        with self.lock:
            if not self.supervisor.usable():
                return
            try:
                for req in reqs:
                    if ends_at_prefill(req):
                        continue
                    if req.rid not in self.opened:
                        prompt = list(req.origin_input_ids)
                        self.link.send(open_message(req, prompt, prespeculate))
                        self.opened[req.rid] = len(prompt)
                    self.last_seen[req.rid] = self.decode_rounds
            except TransportError as exc:
                self.supervisor.fault(f"open: {exc}")

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

    def _remote_drafts(self, reqs: Sequence[Any], planner: RoundPlanner) -> DraftBatch:
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
                link.send(open_message(req, tokens))
            self.opened[req.rid] = len(tokens)
        choice = planner.step(len(reqs))
        self.step_id += 1
        rids = [req.rid for req in reqs]
        spans, features = self.features.take(rids)
        # A sync round's draft runs on every core (`core_lending`); others on the speculator's.
        cpus = [] if choice.prespeculate else self.supervisor.lending.sync_draft_cpus
        step = step_message(self.step_id, outcomes, rids, choice, spans, features, cpus)
        link.send_step(step, features=features)
        got = self._wait_drafts(link)
        timing = got.drafts.timing
        planner.observe_build(timing)
        batch, missing = reply_batch(reqs, got, self.vocab_size, self.target_device, self.local)
        for i in missing:
            self.opened.pop(reqs[i].rid, None)
        self.last_timing = timing
        self.speculator_phases.merge(timing.phases)
        self.drafts_received += 1
        self.draft_forwards += timing.forwards
        self.build_draft_forwards += timing.build_forwards
        return batch

    def _wait_drafts(self, link: TargetLink) -> ReceivedDrafts:
        """The reply to the outstanding Step, checking the process between short polls (a
        killed speculator is found at once). The timeout is progress-based: the wait goes on
        while the speculator keeps using CPU (a busy speculator on a slow CPU is never
        restarted) and ends after `--ssd-speculator-timeout` seconds without progress (a
        stopped or blocked one), or after `HARD_TIMEOUT_FACTOR` timeouts in all.

        Raises:
            TransportError: the process exited, or no drafts within those limits.
        """
        timeout = self.config.speculator_timeout
        start = last_progress = time.monotonic()
        hard_deadline = start + HARD_TIMEOUT_FACTOR * timeout
        cpu: float | None = None
        while True:
            left = min(last_progress + timeout, hard_deadline) - time.monotonic()
            got = link.recv_drafts(self.step_id, max(min(ALIVE_POLL_S, left), 0.0))
            if got is not None:
                return got
            process = self.supervisor.process
            if process is None or not process.alive():
                raise TransportError("the speculator process exited while drafting")
            used = process.cpu_seconds()
            now = time.monotonic()
            if used is not None:
                if cpu is not None and used - cpu >= PROGRESS_CPU_S:
                    last_progress = now
                cpu = used
            if now - last_progress >= timeout:
                raise TransportError(f"no drafts within {timeout} s without speculator progress")
            if now >= hard_deadline:
                raise TransportError(f"no drafts within {HARD_TIMEOUT_FACTOR} x {timeout} s")

    def record_outcomes(
        self, rids: Sequence[str], accept_lens: list[int], bonus: list[int]
    ) -> None:
        """The verified outcome (k, t*) of each request this round (sent with the next Step)."""
        for rid, k, t in zip(rids, accept_lens, bonus, strict=True):
            if rid in self.opened:
                self.pending[rid] = (k, t)

    def add_features(self, rids: Sequence[str], rows: Sequence[tuple[int, torch.Tensor]]) -> None:
        """The target's EAGLE-3 features of a forward: per request of `rids`, (first position,
        features [n, F]) (`feature_buffer.extend_features` / `verify_features`); they go to the
        speculator with the next Step that carries the request. Requests the speculator does
        not hold (it is down, or they were never opened) are skipped."""
        with self.lock:
            for rid, (start, feats) in zip(rids, rows, strict=True):
                if rid in self.opened:
                    self.features.add(rid, start, feats)

    def close(self, rid: str) -> None:
        """The request finished or was aborted."""
        with self.lock:
            self.pending.pop(rid, None)
            self.features.drop(rid)
            self.last_seen.pop(rid, None)
            if self.opened.pop(rid, None) is not None and self.supervisor.usable():
                try:
                    self.link.send(Close(rid=rid))
                except TransportError as exc:
                    self.supervisor.fault(f"close: {exc}")

    def reset(self) -> None:
        """Forget all requests (SGLang flushed its caches)."""
        for rid in list(self.opened):
            self.close(rid)

    def shutdown(self) -> None:
        """Stop the speculator (and any restart in progress) for good; idempotent."""
        self.supervisor.stop()

"""The speculator process's loop: messages in, drafts out, pre-speculation in between.

A Step is answered at once (cache lookups and the target's chosen backup for misses); in async
mode the speculator then builds the next round's speculation cache while the target verifies
(docs/design.md#the-two-processes). An Open only registers the request: its prefill is fed in chunks
while no
message waits (`SpeculatorEngine.advance_prefill`), and a Step never waits for more than one
chunk of it. Bad input from the link is logged and answered, never fatal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec
import torch

from sglang_ssd.launch.placement import machine_cpus, widened
from sglang_ssd.phases import PhaseTimer
from sglang_ssd.speculator.engine import OutcomeIn, SpeculatorEngine
from sglang_ssd.speculator.parent import parent_alive
from sglang_ssd.speculator.state import Draft
from sglang_ssd.transport import (
    Close,
    Configure,
    ConfigureAck,
    DraftEntry,
    Drafts,
    DraftSource,
    Error,
    LiveSettings,
    Open,
    Shutdown,
    SpeculatorLink,
    SpeculatorStats,
    SpeculatorTiming,
    StatsReply,
    StatsRequest,
    Step,
    TransportError,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

IDLE_POLL_S = 1.0


class SpeculatorServer:
    """Serves one target over `link` with `engine` until Shutdown or the parent exits."""

    def __init__(self, link: SpeculatorLink, engine: SpeculatorEngine, parent_pid: int) -> None:
        self.link = link
        self.engine = engine
        self.parent_pid = parent_pid
        # The speculator's own cores: a sync round's Step widens it for its draft, then back.
        self.own_cpus = sorted(os.sched_getaffinity(0))
        self._forwards_reported = engine.model.forward_count  # draft forwards told the target
        # Each Step's work, measured once: `lookup` (outcomes and features in), `backup`
        # (serving the drafts), `send`, and `build` (pre-speculation after the Step). Totals
        # since start feed `stats`; each Step's own seconds feed its `SpeculatorTiming`.
        self.steps = PhaseTimer()
        # The columns q is sent at (the draft vocabulary; the Hello announced them), where the
        # draft's q rows are: q is built and sent on the model's device, never via the CPU.
        cols = engine.q_columns
        self._q_columns = None if cols is None else cols.to(engine.model.device)

    def run(self) -> None:
        """Loop until Shutdown, a lost parent, or a transport failure (which ends the process:
        the target restarts a fresh speculator)."""
        while True:
            prefilling = self.engine.prefill_pending()
            msg = self.link.recv(0.0 if prefilling else IDLE_POLL_S)
            if msg is None:
                if prefilling:
                    self._advance_prefill()
                elif not parent_alive(self.parent_pid):
                    logger.warning("SSD speculator: parent %d is gone; exiting", self.parent_pid)
                    return
                continue
            if isinstance(msg, Shutdown):
                return
            try:
                self._dispatch(msg)
            except TransportError as exc:  # the link is unusable: the target starts a new one
                logger.error("SSD speculator: link failed (%s); exiting", exc)
                return
            except Exception as exc:  # keep serving: report and go on
                logger.exception("SSD speculator: failed to handle %s", type(msg).__name__)
                try:
                    self.link.send(Error(reason=f"{type(msg).__name__}: {exc}"[:1000]))
                except TransportError as send_exc:
                    logger.error("SSD speculator: link failed (%s); exiting", send_exc)
                    return

    def _advance_prefill(self) -> None:
        """One chunk of pending prefill; a failure drops the requests it was feeding (their
        next Step finds them missing, and the target re-opens them) instead of ending the loop."""
        try:
            self.engine.advance_prefill()
        except Exception:
            logger.exception("SSD speculator: prefill failed; dropping the prefilling requests")
            for rid, state in list(self.engine.requests.items()):
                if not state.prefilled or state.first_round:
                    self.engine.close(rid)

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, Step):
            self._step(msg)
        elif isinstance(msg, Open):
            s = msg.sampling
            self.engine.open(
                msg.rid,
                msg.token_ids,
                s.temperature,
                s.top_k,
                s.top_p,
                s.seed,
                prefill=False,
                first_round=msg.prespeculate,
            )
        elif isinstance(msg, Close):
            self.engine.close(msg.rid)
        elif isinstance(msg, Configure):
            self._configure(msg)
        elif isinstance(msg, StatsRequest):
            self.link.send(StatsReply(stats=self.stats()))
        elif isinstance(msg, Error):
            logger.warning("SSD speculator: target reported an error: %s", msg.reason)

    def _configure(self, msg: Configure) -> None:
        self.engine.config = self.engine.config.replace(**msg.changes.given())
        self.link.send(ConfigureAck(applied=LiveSettings.of(self.engine.config)))

    def _step(self, step: Step) -> None:
        engine, steps = self.engine, self.steps
        with steps.phase("lookup"):
            outcomes = [OutcomeIn(o.rid, o.accept_len, o.bonus, o.extra) for o in step.outcomes]
            engine.build_depth = step.tree_depth  # for every build until the next Step
            engine.apply_outcomes(outcomes)
            self._add_features(step)
        with steps.phase("backup"), self._cores(step.draft_cpus):
            drafts = self._timed_rest(
                "serve",
                lambda: engine.serve(
                    step.requests,
                    step.backup,
                    engine.config.lookahead,
                    feed_all=not step.prespeculate,
                ),
            )
        with engine.phases.phase("pack"):
            reply, tokens, q = self._pack(step, drafts, self._timing())
        send_s = self.link.send_drafts(reply, tokens, q)
        engine.phases.add("send", send_s)
        steps.add("send", send_s)
        steps.last["build"] = 0.0  # until this Step's build, none ran after it
        if step.prespeculate:
            with steps.phase("build"):
                self._timed_rest("build", lambda: engine.build(step.requests))

    def _cores(self, cpus: list[int]) -> contextlib.AbstractContextManager[None]:
        """Within the block this process runs on `cpus` with as many torch threads (a sync
        round's draft on every core: `worker.core_lending`), then on its own cores again;
        `cpus` empty or naming a core it may not use: its own (logged)."""
        if not cpus or not self.own_cpus or sorted(cpus) == self.own_cpus:
            return contextlib.nullcontext()
        if not set(cpus) <= set(machine_cpus()):
            logger.warning("SSD speculator: cannot draft on CPUs %s; drafting on its own", cpus)
            return contextlib.nullcontext()
        return widened(self.own_cpus, cpus)

    def _add_features(self, step: Step) -> None:
        """The Step's target features (an EAGLE-3 head draft; the link received the tensor with
        the Step) to each request, then one refresh forward of the rows they make stale."""
        features = self.link.last_features if step.features else None
        if features is None:
            return
        offset = 0
        for span in step.features:
            self.engine.add_features(span.rid, span.start, features[offset : offset + span.count])
            offset += span.count
        self.engine.refresh_features()

    def _timed_rest(self, name: str, work: Callable[[], T]) -> T:
        """Run `work`; the part of its time no phase inside it claimed is ``{name}_other``
        (packing layouts, Python bookkeeping), so a round's phases add up to its time."""
        phases = self.engine.phases
        claimed = sum(phases.seconds.values())
        start = time.perf_counter()
        result = work()
        elapsed = time.perf_counter() - start
        phases.add(f"{name}_other", max(elapsed - (sum(phases.seconds.values()) - claimed), 0.0))
        return result

    def _timing(self) -> SpeculatorTiming:
        """This Step's timing: the latest build, this Step's lookup and backup, and the phases
        since the previous Drafts (which the target sums for `/ssd/stats`) with the draft
        forwards they ran (the target's `DepthTuner` divides by them)."""
        engine = self.engine
        forwards = engine.model.forward_count - self._forwards_reported
        self._forwards_reported = engine.model.forward_count
        build_forwards, engine.build_forwards = engine.build_forwards, 0
        last = self.steps.last
        return SpeculatorTiming(
            build_s=last.get("build", 0.0),
            lookup_s=last.get("lookup", 0.0),
            backup_s=last.get("backup", 0.0),
            phases=engine.phases.take(),
            forwards=forwards,
            build_forwards=build_forwards,
        )

    def _pack(
        self, step: Step, drafts: list[Draft | None], timing: SpeculatorTiming
    ) -> tuple[Drafts, torch.Tensor, torch.Tensor | None]:
        """The Drafts message and its tensors: tokens int64 [B, Dmax] (CPU) and q float32
        [n_q, Dmax, W] on the device the q rows were sampled on, W the draft vocabulary's ids
        (`SpeculatorEngine.q_columns`; q is zero at every other id) or all V."""
        vocab = self.engine.vocab_size
        cols = self._q_columns
        width = vocab if cols is None else cols.numel()
        depth = max((len(d.tokens) for d in drafts if d is not None), default=0)
        tokens = torch.full((len(drafts), depth), -1, dtype=torch.int64)
        with_q = [d.q for d in drafts if d is not None and d.q is not None]
        q = with_q[0].new_zeros(len(with_q), depth, width) if with_q else None
        entries = []
        for i, (rid, d) in enumerate(zip(step.requests, drafts, strict=True)):
            if d is None:
                entries.append(
                    DraftEntry(rid=rid, source=DraftSource.MISSING, depth=0, has_q=False)
                )
                continue
            tokens[i, : len(d.tokens)] = torch.tensor(d.tokens, dtype=torch.int64)
            entries.append(
                DraftEntry(rid=rid, source=d.source, depth=len(d.tokens), has_q=d.q is not None)
            )
        if q is not None:  # rows in entry order, each written once, at W columns
            for row, full in zip(q, with_q, strict=True):
                row[: full.shape[0]] = full if cols is None else full.index_select(1, cols)
        msg = Drafts(
            step_id=step.step_id,
            entries=entries,
            max_depth=depth,
            vocab_size=vocab,
            timing=timing,
            q_columns=0 if cols is None else width,
        )
        return msg, tokens, q

    def stats(self) -> SpeculatorStats:
        """Counters for `/ssd/stats`: the engine's (cache hits, pool use, hit exponent, ...)
        with the totals since start of the Steps answered (Drafts sent) and the seconds of each
        part of them, a view of `steps`."""
        calls, seconds = self.steps.calls, self.steps.seconds
        return msgspec.structs.replace(
            self.engine.stats(),
            steps=calls.get("send", 0),
            build_s=seconds.get("build", 0.0),
            lookup_s=seconds.get("lookup", 0.0),
            backup_s=seconds.get("backup", 0.0),
            send_s=seconds.get("send", 0.0),
        )

"""Per-round timers and counters of the SSD target worker.

Times are seconds; aggregated totals feed SGLang's decode log line, the Prometheus metrics and
the `/ssd/stats` admin endpoint.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_ssd.phases import PhaseTimer, device_sync

logger = logging.getLogger(__name__)


# The target's round phases (`SSDWorker._decode`) that its per-round figures add up.
FORWARD_PHASES = ("build_batch", "forward")
VERIFY_PHASES = (*FORWARD_PHASES, "verify", "commit", "record")


@dataclass(frozen=True)
class RoundStats:
    """The target's totals over decode rounds of one mode, at one moment (`RoundTimer.snapshot`),
    or over a window between two moments (`later - earlier`).

    Attributes:
        rounds: decode rounds verified.
        requests: request-rounds (Σ batch sizes).
        accepted: Σ accepted draft tokens (bonus excluded).
        sources: request-rounds by draft source (cache, jit, ngram, random, local-ngram, plain).
        accepted_by_source: Σ accepted draft tokens by draft source (acceptance on hits vs
            misses, for the speedup model's α_hit and α_miss).
        phases: seconds by phase of the rounds (`SSDWorker._decode`, `RoundClock`).
    """

    rounds: int = 0
    requests: int = 0
    accepted: int = 0
    sources: Mapping[str, int] = field(default_factory=dict)
    accepted_by_source: Mapping[str, int] = field(default_factory=dict)
    phases: Mapping[str, float] = field(default_factory=dict)

    def __sub__(self, earlier: RoundStats) -> RoundStats:
        """The window from `earlier` to this snapshot (every total, each key's difference)."""

        def minus(now: Mapping[str, Any], then: Mapping[str, Any]) -> dict[str, Any]:
            return {k: v - then.get(k, 0) for k, v in now.items()}

        return RoundStats(
            rounds=self.rounds - earlier.rounds,
            requests=self.requests - earlier.requests,
            accepted=self.accepted - earlier.accepted,
            sources=minus(self.sources, earlier.sources),
            accepted_by_source=minus(self.accepted_by_source, earlier.accepted_by_source),
            phases=minus(self.phases, earlier.phases),
        )

    def spent(self, names: Sequence[str]) -> float:
        """Seconds in the phases `names`."""
        return sum(self.phases.get(name, 0.0) for name in names)

    @property
    def wait_draft_s(self) -> float:
        """Seconds the target waited for drafts (transport included)."""
        return self.spent(("wait_draft",))

    @property
    def forward_s(self) -> float:
        """Seconds building the verify batch and running the TARGET_VERIFY forward."""
        return self.spent(FORWARD_PHASES)

    @property
    def verify_s(self) -> float:
        """Seconds from drafts in hand to the round recorded (`VERIFY_PHASES`)."""
        return self.spent(VERIFY_PHASES)

    @property
    def hits(self) -> int:
        """Request-rounds whose draft was a speculation-cache hit."""
        return int(self.sources.get("cache", 0))

    @property
    def target_busy_s(self) -> float:
        """The target's seconds in its rounds' phases except waiting for drafts."""
        return sum(v for k, v in self.phases.items() if k != "wait_draft")

    def summary(self) -> dict[str, Any]:
        """`/ssd/stats`' view: counts, per-round means (seconds), rates, and the per-source and
        per-phase groups (`rounds_by_source`, `accepted_by_source`, `target_phases`: seconds
        per round)."""
        rounds, requests = max(self.rounds, 1), max(self.requests, 1)
        return {
            "rounds": self.rounds,
            "request_rounds": self.requests,
            "avg_wait_draft_s": self.wait_draft_s / rounds,
            "avg_verify_s": self.verify_s / rounds,
            "avg_forward_s": self.forward_s / rounds,
            "accept_length": 1.0 + self.accepted / requests,
            "cache_hit_rate": self.hits / requests,
            "rounds_by_source": dict(self.sources),
            "accepted_by_source": dict(self.accepted_by_source),
            "target_phases": {k: v / rounds for k, v in sorted(self.phases.items())},
        }


@dataclass
class RoundTimer:
    """Running totals over decode rounds of one mode (the fields of `RoundStats`; its seconds
    are the phases'); written by the scheduler thread, read through `snapshot` from any
    thread."""

    rounds: int = 0
    requests: int = 0
    accepted: int = 0
    sources: Counter = field(default_factory=Counter)
    accepted_by_source: Counter = field(default_factory=Counter)
    phases: PhaseTimer = field(default_factory=PhaseTimer)

    def record(
        self,
        batch_size: int,
        phases: Mapping[str, float],
        accept_len: torch.Tensor,
        sources: list[str],
    ) -> None:
        """Add one round of `batch_size` requests: its seconds by phase, k per request
        (`accept_len` int [B]) and each request's draft source.

        Raises:
            ValueError: when `sources` and `accept_len` differ in length.
        """
        self.rounds += 1
        self.requests += batch_size
        self.phases.merge(phases)
        self.accepted += int(accept_len.sum())
        self.sources.update(sources)
        for source, accepted in zip(sources, accept_len.tolist(), strict=True):
            self.accepted_by_source[source] += int(accepted)

    def snapshot(self, attempts: int = 3) -> RoundStats:
        """The totals now. From another thread while rounds are recorded, copying a counter can
        meet a key being added: retried up to `attempts` times.

        Raises:
            RuntimeError: when every attempt met a concurrent change.
        """
        for _ in range(attempts - 1):
            try:
                return self._copy()
            except RuntimeError:
                continue
        return self._copy()

    def _copy(self) -> RoundStats:
        return RoundStats(
            rounds=self.rounds,
            requests=self.requests,
            accepted=self.accepted,
            sources=dict(self.sources),
            accepted_by_source=dict(self.accepted_by_source),
            phases=dict(self.phases.seconds),
        )


# On CUDA, one round in `PHASE_SAMPLE_EVERY` synchronises the device at every phase boundary
# (its phases hold their own GPU time); the others synchronise once, at the round's end.
PHASE_SAMPLE_EVERY = 8
# Phases that keep their host-clock time on a round that does not sample phases: the device is
# idle when the round starts (the previous one ended on a sync), and the gap is host time.
_HOST_PHASES = ("scheduler", "wait_draft")


class RoundClock:
    """One decode round's phases at a time, and the scheduler's time between rounds.

    `start` opens a round: its phases go to a fresh `PhaseTimer`, which begins with
    `scheduler`, the time SGLang spent since the previous decode round ended (not after a
    prefill, `prefill`, whose time is its own). Once `SSDWorker._decode` knows what the round
    was, its phases are added to that kind of round's `RoundTimer`.

    On a CUDA device (or with `sync` given) a round either samples phases, synchronising at
    every phase boundary (the first round, then one in `sample_every`), or synchronises once,
    in `stop`: its round time is then exact and its device phases (all but `_HOST_PHASES`) are
    that time split as in the latest sampled round. `spent` reads 0.0 (not measured) on such a
    round. On the CPU every round is measured exactly, without syncs.
    """

    def __init__(
        self,
        device: Any = "cpu",
        sample_every: int = PHASE_SAMPLE_EVERY,
        sync: Callable[[], None] | None = None,
    ) -> None:
        """`sync`: the device synchronise to use instead of `device`'s (None: `device`'s,
        none on the CPU); `sample_every` >= 1.

        Raises:
            ValueError: when `sample_every` < 1.
        """
        if sample_every < 1:
            raise ValueError(f"sample_every must be >= 1, got {sample_every}")
        self.sync = sync if sync is not None else device_sync(device)
        self.sample_every = sample_every
        self.sampled = True  # whether the open round synchronises at its phase boundaries
        self.rounds = 0  # rounds started
        self.phases = PhaseTimer(self.sync)
        self.gap_s = 0.0  # the latest scheduler time between two decode rounds
        self._start = 0.0
        self._last_end: float | None = None
        self._split: dict[str, float] = {}  # the latest sampled round's device phases, fractions

    def start(self) -> PhaseTimer:
        """Open a round; returns its phase timer."""
        self._start = time.perf_counter()
        self.sampled = self.sync is None or self.rounds % self.sample_every == 0
        self.rounds += 1
        self.phases = PhaseTimer(self.sync if self.sampled else None)
        if self._last_end is not None:
            self.gap_s = self._start - self._last_end
            self.phases.add("scheduler", self.gap_s)
        return self.phases

    def round_s(self) -> float:
        """The round's wall time so far in seconds, the scheduler's gap before it included
        (none right after a prefill)."""
        return time.perf_counter() - self._start + self.gap_s

    def stop(self) -> dict[str, float]:
        """Close the round (a round that does not sample phases synchronises here); returns its
        seconds by phase."""
        if not self.sampled and self.sync is not None:
            self.sync()
        self._last_end = time.perf_counter()
        seconds = self.phases.take()
        device = {k: v for k, v in seconds.items() if k not in _HOST_PHASES}
        if self.sampled:
            total = sum(device.values())
            if total > 0:
                self._split = {k: v / total for k, v in device.items()}
            return seconds
        busy = self._last_end - self._start - seconds.get("wait_draft", 0.0)
        weights = self._split if self._split.keys() == device.keys() else device
        norm = sum(weights.values())
        for name, weight in weights.items():
            seconds[name] = busy * weight / norm if norm > 0 else 0.0
        return seconds

    def prefill(self) -> None:
        """A prefill ran: the next decode round's gap is not scheduler time."""
        self._last_end = None
        self.gap_s = 0.0

    def spent(self, names: Sequence[str]) -> float:
        """Seconds of the open round in the phases `names`; 0.0 (not measured) on a round that
        does not sample phases."""
        if not self.sampled:
            return 0.0
        return sum(self.phases.seconds.get(name, 0.0) for name in names)


# Per-request draft-source counts live on SGLang's `Req` under this attribute
# (read back by `sglang_ssd.integration.request_metrics` for `meta_info`).
_REQ_ATTR = "ssd_draft_sources"


def count_request_rounds(reqs: Sequence[Any], sources: Sequence[str]) -> None:
    """Count one decode round for each request by where its draft came from.

    Args:
        reqs: the batch's SGLang `Req`s.
        sources: per request, ``cache`` or the backup that drafted it (same order as `reqs`).
    """
    for req, source in zip(reqs, sources, strict=True):
        counts = getattr(req, _REQ_ATTR, None)
        if counts is None:
            counts = Counter()
            setattr(req, _REQ_ATTR, counts)
        counts[source] += 1


def snapshot(req: Any) -> dict[str, int]:
    """The request's round counts by draft source (empty before its first decode round)."""
    return dict(getattr(req, _REQ_ATTR, None) or {})

"""Speculate ahead, or just in time with the cores lent: `SyncRoundPolicy` (`--ssd-sync-rounds`).

A speculative round of SSD (async) hides the next round's draft behind the target's verify, at
the price of the speculator's cores: the verify runs on the target's cores alone. A *sync round*
gives that trade back for one round: the speculator drafts just in time from the committed text
(a chain of γ tokens, no pre-speculation after it), then it is stopped and the target verifies
on its cores and the speculator's (`core_lending`, as plain rounds do). Output is exact either
way (the verify samples against the q the speculator sent, Theorem 1).

Which pays is a property of the machine and the text, so it is measured, not modelled. On the
2-core AMX Xeon at batch 1 a verify took 0.33 s on two cores against 0.52 s on one, and
synchronous SD with the same int8 draft out-ran SSD 1.10x (5.26 against 4.77 tok/s,
eval/results/ssd-bench-equal-b1-greedy-xeon-amx.json); on the AVX-512 EPYC, where the second
core helps the verify less, SSD won. Per batch size b the policy keeps moving averages of each
kind's round time and tokens per request (k + 1, bonus included) and runs the kind with the
higher tokens per second, the other kind taking over only when it is rated `margin` times
faster. Each run of a kind starts its averages afresh at the batch sizes it measures, so a
probe replaces what the kind measured before instead of blending with it (a new user's server
judged pre-speculation by the startup warm-up's slow rounds, 4.0 tokens per second against
13.0 measured warm later, and probes averaged into that stayed below the sync rounds' 10.3).
A batch size with a kind not measured within a factor 2 runs that kind to measure it (async
first). While one kind holds, the other is probed for a few rounds at intervals that double
while the probe confirms the choice (`ProbeSchedule`). The caller does not measure the first
round of each kind since start, nor the first round after a switch of kind (an async round
after sync ones has a cold cache: no pre-speculation ran; a sync round after async ones may hit
the cache built before it), so a probe of 4 rounds gives 3 measurements.

"never" (default) always pre-speculates, "always" drafts every speculative round just in time
with the cores lent (`--ssd-mode sync`'s drafting on SSD's placement), "auto" chooses. Plain
rounds (`round_mode`) are decided first: this policy splits the speculative rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sglang_ssd.config import SYNC_ROUNDS
from sglang_ssd.saguaro.averages import Ema
from sglang_ssd.worker.probes import ProbeSchedule
from sglang_ssd.worker.round_mode import nearest_average

ASYNC, SYNC = False, True  # a speculative round's kind: pre-speculated, or just in time


@dataclass
class SyncRoundPolicy:
    """Chooses, for each speculative round, pre-speculation (async) or a just-in-time draft with
    the speculator's cores lent to the verify (sync): see the module docstring.

    Attributes:
        setting: "auto" (measure and choose), "never" (always async), "always" (always sync).
        ema_weight: weight in (0, 1] of a new round in the moving averages.
        probes: probes of the other kind (4 rounds each, an async probe's first cold and not
            measured, after 16 to 256 rounds: the interval doubles each time a probe confirms
            the kind in use and starts again at 16 when the other kind takes over).
        margin: the other kind must be rated this factor faster to take over (>= 1).

    Raises:
        ValueError: on an unknown setting or out-of-range parameters.
    """

    setting: str = "never"
    ema_weight: float = 0.3
    probes: ProbeSchedule = field(default_factory=ProbeSchedule)
    margin: float = 1.1
    _times: dict[bool, dict[int, Ema]] = field(init=False)
    _tokens: dict[bool, dict[int, Ema]] = field(init=False)
    _current: bool = field(init=False, default=ASYNC)
    _last_observed: bool | None = field(init=False, default=None)
    _run_sizes: set[int] = field(init=False, default_factory=set)
    rounds: dict[bool, int] = field(init=False)

    def __post_init__(self) -> None:
        if self.setting not in SYNC_ROUNDS:
            raise ValueError(f"setting must be one of {SYNC_ROUNDS}, got {self.setting!r}")
        if not 0.0 < self.ema_weight <= 1.0:
            raise ValueError(f"ema_weight must be in (0, 1], got {self.ema_weight}")
        if self.margin < 1.0:
            raise ValueError(f"margin must be >= 1, got {self.margin}")
        self._times = {ASYNC: {}, SYNC: {}}
        self._tokens = {ASYNC: {}, SYNC: {}}
        self.rounds = {ASYNC: 0, SYNC: 0}

    def choose(self, batch_size: int) -> bool:
        """Whether the next speculative round of `batch_size` (>= 1) requests is a sync round.

        Raises:
            ValueError: on a batch size < 1.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        sync = self._auto(batch_size) if self.setting == "auto" else self.setting == "always"
        self.rounds[sync] += 1
        return sync

    def _auto(self, batch_size: int) -> bool:
        if self.probes.probing():
            return not self._current
        for kind in (ASYNC, SYNC):  # measure each kind near this batch size, async first
            if self.rate(kind, batch_size, max_ratio=2.0) is None:
                return kind
        preferred = self.preferred(batch_size)
        if preferred != self._current:
            self._current = preferred
            self.probes.changed()
            return self._current
        if self.probes.due():  # probe the other kind, then wait longer
            return not self._current
        return self._current

    def preferred(self, batch_size: int) -> bool:
        """The kind rated faster at `batch_size` (the one in use keeps its place unless the
        other is `margin` times faster; the one in use while either is unmeasured)."""
        in_use = self.rate(self._current, batch_size)
        other = self.rate(not self._current, batch_size)
        if in_use is None or other is None:
            return self._current
        return (not self._current) if other > self.margin * in_use else self._current

    def rate(self, sync: bool, batch_size: int, max_ratio: float = math.inf) -> float | None:
        """Tokens per request per second of `sync` rounds at the nearest batch size measured
        within `max_ratio` of `batch_size`; None before one was measured."""
        seconds = nearest_average(self._times[sync], batch_size, max_ratio)
        tokens = nearest_average(self._tokens[sync], batch_size, max_ratio)
        if seconds is None or tokens is None:  # `observe` keeps both > 0
            return None
        return tokens / seconds

    @property
    def sync_now(self) -> bool:
        """Whether sync rounds are the kind in use ("always", or "auto" that chose them)."""
        return self.setting == "always" or (self.setting == "auto" and self._current == SYNC)

    def observe(self, sync: bool, batch_size: int, round_s: float, mean_tokens: float) -> None:
        """Fold in one measured speculative round of kind `sync` (the caller skips cold ones).

        Args:
            sync: the round's kind.
            batch_size: its b >= 1.
            round_s: its wall time in seconds (> 0), scheduler time between rounds included.
            mean_tokens: tokens it committed per request (k + 1, >= 1).

        Raises:
            ValueError: on a batch size < 1, a non-positive time or a mean below 1 token.
        """
        if batch_size < 1 or not (math.isfinite(round_s) and round_s > 0) or not mean_tokens >= 1:
            raise ValueError(
                f"need batch_size >= 1, round_s > 0, mean_tokens >= 1; got {batch_size}, "
                f"{round_s}, {mean_tokens}"
            )
        if sync != self._last_observed:  # a new run of this kind
            self._last_observed, self._run_sizes = sync, set()
        if batch_size not in self._run_sizes:  # its figures at this size from earlier runs
            self._run_sizes.add(batch_size)  # are stale: start afresh
            self._times[sync][batch_size] = Ema(self.ema_weight)
            self._tokens[sync][batch_size] = Ema(self.ema_weight)
        self._times[sync][batch_size].add(round_s)
        self._tokens[sync][batch_size].add(mean_tokens)

    def stats(self) -> dict[str, float | int]:
        """For `/ssd/stats`' `speculator`: speculative rounds by kind (counts), the kind in use
        (1 = sync) and each kind's measured tokens per request per second at batch size 1 (0
        before a measurement)."""
        return {
            "sync_rounds": self.rounds[SYNC],
            "async_rounds": self.rounds[ASYNC],
            "sync_mode": int(self.sync_now),
            "rate_sync_b1": self.rate(SYNC, 1, max_ratio=1.0) or 0.0,
            "rate_async_b1": self.rate(ASYNC, 1, max_ratio=1.0) or 0.0,
        }

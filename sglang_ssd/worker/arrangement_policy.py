"""Which arrangement each decode round runs, from measured rates: `ArrangementPolicy`.

The choice is measured, not modelled. Per batch-size bucket (1, 2, 3-4, 5-8, ...: `bucket`) and
arrangement (`round_mode.Arrangement`) the policy keeps moving averages of the round's wall time
(scheduler time between rounds included) and of the tokens it committed per request (k + 1,
bonus included; 1 for a plain round), so its rate is tokens per request per second:

- calibration: the first rounds at a bucket run each offered arrangement in turn until
  `calibration_rounds` of its rounds there are measured (sync first: the prior on a 2-core CPU);
  the bucket's figures are then logged and its fastest arrangement is held;
- live: every measured round updates its arrangement's figures at its bucket, so the held
  arrangement follows the text; the others are re-probed for `probe_rounds` rounds at
  intervals that double while probes confirm the choice (`ProbeSchedule`), each probe replacing
  what that arrangement measured before (stale figures do not blend in);
- switch: another arrangement takes over when it is rated `margin` times faster and what it
  saves over `horizon_rounds` of its rounds pays for the switch: the first round after a
  change of arrangement (a cold cache after moving to async: no pre-speculation ran; re-pinned
  threads) is not measured as a rate, its time beyond what its tokens cost at the steady rate
  is the switch's cost, averaged per arrangement switched to (a prior of half a round into
  async, nothing into the others until measured).

A batch where no request may generate more than one token is plain when plain is offered: no
draft token could be used. Each arrangement's first round since start (one-time costs: the
startup warm-up's first speculative round took 1.8 s at batch 1 against 0.45 s later) counts
neither as a rate nor as a switch cost, nor does a round the caller marks not rated (a request
with γ or fewer tokens left: its limit capped the tokens, as in the startup warm-up's short
requests).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sglang_ssd.saguaro.averages import Ema
from sglang_ssd.worker.probes import ProbeSchedule
from sglang_ssd.worker.round_mode import Arrangement

logger = logging.getLogger(__name__)

ASYNC_SWITCH_PRIOR = 0.5  # cost of a switch into async before one is measured, in async rounds


def bucket(batch_size: int) -> int:
    """The batch-size bucket of `batch_size` (>= 1): the power of 2 at or above it.

    Raises:
        ValueError: on a batch size < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return 1 << (batch_size - 1).bit_length()


@dataclass
class Figures:
    """One arrangement's measurements at one bucket: round seconds and tokens per request per
    round (moving averages), and whether the next measured round starts them afresh (a probe)."""

    seconds: Ema
    tokens: Ema
    fresh: bool = False

    @property
    def rate(self) -> float | None:
        """Tokens per request per second; None before a measured round."""
        if self.seconds.value is None or self.tokens.value is None or self.seconds.value <= 0:
            return None
        return self.tokens.value / self.seconds.value


@dataclass
class ArrangementPolicy:
    """Chooses each decode round's `Arrangement` (module docstring).

    Attributes:
        offered: the arrangements to choose from (`round_mode.offered`), in calibration order;
            one: that one always.
        cycle: test-only: run the offered arrangements in turn, a switch every round.
        ema_weight: weight in (0, 1] of a new round in the moving averages.
        calibration_rounds: measured rounds of each offered arrangement per bucket before the
            policy chooses there (each run's first round is a switch, not measured).
        margin: another arrangement must be rated this factor faster to take over (>= 1).
        horizon_rounds: rounds over which a switch's saving must pay for its cost.
        probe_rounds: rounds of a probe of another arrangement (its first a switch).

    Raises:
        ValueError: on no arrangement offered or out-of-range parameters.
    """

    offered: tuple[Arrangement, ...]
    cycle: bool = False
    ema_weight: float = 0.3  # rounds measured: moving averages, calibration
    calibration_rounds: int = 2
    margin: float = 1.05  # switching: hysteresis, its cost's horizon, re-probes
    horizon_rounds: int = 16
    probe_rounds: int = 3
    rounds: dict[Arrangement, int] = field(init=False)
    switches: int = field(init=False, default=0)
    _figures: dict[int, dict[Arrangement, Figures]] = field(init=False)
    _held: dict[int, Arrangement] = field(init=False)
    _probes: dict[int, ProbeSchedule] = field(init=False)
    _probing: dict[int, list] = field(init=False)  # bucket -> [arrangement, rounds left]
    _switch_s: dict[Arrangement, Ema] = field(init=False)
    _last: Arrangement | None = field(init=False, default=None)
    _seen: set[Arrangement] = field(init=False)

    def __post_init__(self) -> None:
        if not self.offered:
            raise ValueError("at least one arrangement must be offered")
        if not 0.0 < self.ema_weight <= 1.0 or self.margin < 1.0:
            raise ValueError("need ema_weight in (0, 1] and margin >= 1")
        if self.calibration_rounds < 1 or self.horizon_rounds < 1 or self.probe_rounds < 2:
            raise ValueError("need calibration_rounds >= 1, horizon_rounds >= 1, probe_rounds >= 2")
        self.offered = tuple(Arrangement(a) for a in self.offered)
        self.rounds = {a: 0 for a in Arrangement}
        self._figures, self._held, self._probes, self._probing = {}, {}, {}, {}
        self._switch_s = {a: Ema(self.ema_weight) for a in Arrangement}
        self._seen = set()

    # ------------------------------------------------------------------ choice
    def choose(self, batch_size: int, most_tokens_left: int) -> Arrangement:
        """The arrangement of the next decode round of `batch_size` (>= 1) requests, the one
        with the most tokens left to generate having `most_tokens_left`.

        Raises:
            ValueError: on a batch size < 1.
        """
        b = bucket(batch_size)
        if len(self.offered) == 1:
            choice = self.offered[0]
        elif self.cycle:
            last = self.offered.index(self._last) if self._last in self.offered else -1
            choice = self.offered[(last + 1) % len(self.offered)]
        elif most_tokens_left <= 1 and Arrangement.PLAIN in self.offered:
            choice = Arrangement.PLAIN
        else:
            choice = self._auto(b)
        self.rounds[choice] += 1
        return choice

    def _auto(self, b: int) -> Arrangement:
        probing = self._probing.get(b)
        if probing and probing[1] > 0:
            probing[1] -= 1
            return probing[0]
        for arrangement in self.offered:  # calibration: each measured here, in offered order
            if self._measured(b, arrangement) < self.calibration_rounds:
                return arrangement
        if b not in self._held:
            self._held[b] = self.fastest(b)
            logger.info("SSD: calibrated %s", self.describe(b))
        preferred = self.preferred(b)
        schedule = self._probes.setdefault(b, ProbeSchedule(rounds=self.probe_rounds))
        if preferred != self._held[b]:
            self._held[b] = preferred
            self.switches += 1
            schedule.changed()
            return preferred
        if schedule.due():
            other = self._probe_target(b)
            self._figures[b][other].fresh = True
            self._probing[b] = [other, self.probe_rounds - 1]
            return other
        return preferred

    def _probe_target(self, b: int) -> Arrangement:
        """The arrangement a probe at bucket `b` runs: of those not held, the one probed least
        recently (the order of `offered`, rotating)."""
        held = self._held[b]
        others = [a for a in self.offered if a != held]
        last = self._probing.get(b)
        if last is not None and last[0] in others:
            return others[(others.index(last[0]) + 1) % len(others)]
        return others[0]

    def fastest(self, b: int) -> Arrangement:
        """The offered arrangement rated fastest at bucket `b` (the first offered when none is
        measured)."""
        rates = {a: self.rate(a, b) for a in self.offered}
        known = {a: r for a, r in rates.items() if r is not None}
        return max(known, key=known.__getitem__) if known else self.offered[0]

    def preferred(self, b: int) -> Arrangement:
        """The arrangement to hold at bucket `b`: the one held unless another is `margin`
        times faster and saves more than its switch costs over `horizon_rounds` of its rounds.
        """
        held, best = self._held.get(b), self.fastest(b)
        if held is None or best == held:
            return best
        r_held, r_best = self.rate(held, b), self.rate(best, b)
        if r_held is None or r_best is None:
            return held if r_held is not None else best
        if r_best < self.margin * r_held:
            return held
        tokens = self.horizon_rounds * (self._figures[b][best].tokens.value or 1.0)
        saved_s = tokens / r_held - tokens / r_best
        return best if saved_s > self.switch_cost(best, b) else held

    def switch_cost(self, arrangement: Arrangement, b: int) -> float:
        """Seconds a switch into `arrangement` costs beyond its steady rate (measured; before
        that `ASYNC_SWITCH_PRIOR` of an async round at `b` for async, 0 otherwise)."""
        measured = self._switch_s[arrangement].value
        if measured is not None:
            return measured
        if arrangement != Arrangement.ASYNC:
            return 0.0
        figures = self._figures.get(b, {}).get(arrangement)
        seconds = figures.seconds.value if figures is not None else None
        return ASYNC_SWITCH_PRIOR * (seconds or 0.0)

    def held(self, batch_size: int) -> Arrangement | None:
        """The arrangement held at `batch_size`'s bucket (None before its calibration ended;
        the fixed one when only one is offered)."""
        if len(self.offered) == 1:
            return self.offered[0]
        return self._held.get(bucket(batch_size))

    def rate(self, arrangement: Arrangement, b: int) -> float | None:
        """Tokens per request per second of `arrangement` at bucket `b`; None before a
        measured round there."""
        figures = self._figures.get(b, {}).get(arrangement)
        return None if figures is None else figures.rate

    def _measured(self, b: int, arrangement: Arrangement) -> int:
        figures = self._figures.get(b, {}).get(arrangement)
        return 0 if figures is None else figures.seconds.count

    # ------------------------------------------------------------------ measurements
    def observe(
        self,
        arrangement: Arrangement,
        batch_size: int,
        round_s: float,
        mean_tokens: float,
        rated: bool = True,
    ) -> None:
        """Fold in one finished round: its figures, or, as the first round after a change of
        arrangement, the switch's cost (neither for each arrangement's first round since start,
        nor for a round not `rated`: one whose requests could not all take a full chain, so
        their tokens left, not the arrangement, capped what it committed).

        Args:
            arrangement: what the round ran.
            batch_size: its b >= 1.
            round_s: its wall time in seconds (> 0), scheduler time between rounds included.
            mean_tokens: tokens it committed per request (k + 1, >= 1).
            rated: whether the round rates its arrangement (it still counts as the last run).

        Raises:
            ValueError: on a batch size < 1, a non-positive time or a mean below 1 token.
        """
        if batch_size < 1 or not (math.isfinite(round_s) and round_s > 0) or not mean_tokens >= 1:
            raise ValueError(
                f"need batch_size >= 1, round_s > 0, mean_tokens >= 1; got {batch_size}, "
                f"{round_s}, {mean_tokens}"
            )
        b = bucket(batch_size)
        first, switched = arrangement not in self._seen, arrangement != self._last
        self._seen.add(arrangement)
        self._last = arrangement
        if first or not rated:
            return
        if switched:
            steady = self.rate(arrangement, b)
            if steady is not None:
                extra = max(round_s - mean_tokens / steady, 0.0)
                self._switch_s[arrangement].add(extra)
            return
        by_arrangement = self._figures.setdefault(b, {})
        figures = by_arrangement.get(arrangement)
        if figures is None or figures.fresh:
            figures = Figures(Ema(self.ema_weight), Ema(self.ema_weight))
            by_arrangement[arrangement] = figures
        figures.seconds.add(round_s)
        figures.tokens.add(mean_tokens)

    # ------------------------------------------------------------------ reports
    def buckets(self) -> dict[str, dict[str, object]]:
        """Per measured bucket (its size as a string): the arrangement held ("" while
        calibrating) and each arrangement's round seconds, tokens per request per round and
        rate (tokens per request per second), for `/ssd/stats`."""
        out: dict[str, dict[str, object]] = {}
        for b in sorted(self._figures):
            row: dict[str, object] = {"held": str(self._held.get(b, ""))}
            for a, f in self._figures[b].items():
                row[str(a)] = {
                    "round_s": f.seconds.value or 0.0,
                    "tokens": f.tokens.value or 0.0,
                    "rate": f.rate or 0.0,
                    "rounds": f.seconds.count,
                }
            out[str(b)] = row
        return out

    def describe(self, b: int, arrangements: Sequence[Arrangement] | None = None) -> str:
        """One line of bucket `b`'s figures, e.g. "b<=1: sync (sync 7.6 tok/s = 3.40 / 0.45 s,
        async 6.1 tok/s = 3.02 / 0.50 s)" (the held arrangement first)."""
        parts = []
        for a in arrangements or self.offered:
            f = self._figures.get(b, {}).get(a)
            if f is not None and f.rate is not None:
                parts.append(
                    f"{a} {f.rate:.2f} tok/s = {f.tokens.value:.2f} / {f.seconds.value:.3f} s"
                )
        held = self._held.get(b, "calibrating")
        return f"b<={b}: {held} ({', '.join(parts) or 'nothing measured'})"

    def stats(self) -> dict[str, float | int]:
        """For `/ssd/stats`' `speculator`: rounds by arrangement and switches (counts)."""
        return {
            "async_rounds": self.rounds[Arrangement.ASYNC],
            "sync_rounds": self.rounds[Arrangement.SYNC],
            "plain_rounds": self.rounds[Arrangement.PLAIN],
            "speculative_rounds": self.rounds[Arrangement.ASYNC] + self.rounds[Arrangement.SYNC],
            "arrangement_switches": self.switches,
        }

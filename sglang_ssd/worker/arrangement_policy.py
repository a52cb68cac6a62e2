"""Which arrangement each decode round runs, from measured rates: `ArrangementPolicy`.

The choice is measured. Per batch-size bucket (1, 2, 3-4, 5-8, ...: `bucket`) and arrangement
(`round_mode.Arrangement`) the policy keeps the median of the recent rounds' wall times
(scheduler time between rounds included: a median, as one-time costs and another process on a
lent core only ever add time); the tokens per request each arrangement's round commits (k + 1,
bonus included; 1 for a plain round) come from figures the arrangements share
(`round_tokens.RoundTokens`: a chain's tokens, the async hit rate and a miss's tokens), so
rounds of different text do not decide between them. An arrangement's rate is tokens per
request per second:

- calibration: the first bucket served runs each offered arrangement in turn until
  `calibration_rounds` of its rounds there are measured (sync first: the prior on a 2-core CPU),
  then logs its figures and holds the fastest; a bucket served later starts from what the
  nearest calibrated bucket holds, the others measured by its probes (a ramp of requests passes
  through buckets 1, 2 and 4 in a few rounds: calibrating each would spend them on the slower
  arrangements);
- live: every measured round updates its arrangement's figures at its bucket, so the held
  arrangement follows the text; the others rated within `probe_within` of it are re-probed for
  `probe_rounds` rounds at intervals that double while probes confirm the choice
  (`ProbeSchedule`), each probe replacing the round times that arrangement measured before
  (stale figures do not blend in); one rated further behind is not (its tokens are live from
  the shared figures, and its round time would have to shrink by that factor);
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

from sglang_ssd.saguaro.averages import Ema, RecentMedian
from sglang_ssd.worker.probes import ProbeSchedule
from sglang_ssd.worker.round_mode import Arrangement
from sglang_ssd.worker.round_tokens import RoundTokens

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


ROUND_WINDOW = 7  # rounds whose median is an arrangement's round time


@dataclass
class Figures:
    """One arrangement's round seconds at one bucket (the median of its recent rounds), and
    whether the next measured round starts it afresh (a probe)."""

    seconds: RecentMedian = field(default_factory=lambda: RecentMedian(ROUND_WINDOW))
    fresh: bool = False


@dataclass
class ArrangementPolicy:
    """Chooses each decode round's `Arrangement` (module docstring).

    Attributes:
        offered: the arrangements to choose from (`round_mode.offered`), in calibration order;
            one: that one always.
        cycle: test-only: run the offered arrangements in turn, a switch every round.
        ema_weight: weight in (0, 1] of a new switch in the switch costs' moving averages.
        calibration_rounds: measured rounds of each offered arrangement per bucket before the
            policy chooses there (each run's first round is a switch, not measured).
        margin: another arrangement must be rated this factor faster to take over (>= 1).
        horizon_rounds: rounds over which a switch's saving must pay for its cost.
        probe_rounds: rounds of a probe of another arrangement (its first a switch).
        probe_within: only arrangements rated at least the held one's rate over this factor
            (> 1) are re-probed.

    Raises:
        ValueError: on no arrangement offered or out-of-range parameters.
    """

    offered: tuple[Arrangement, ...]
    cycle: bool = False
    ema_weight: float = 0.3  # switch costs: moving averages; calibration
    calibration_rounds: int = 2
    margin: float = 1.05  # switching: hysteresis, its cost's horizon, re-probes
    horizon_rounds: int = 16
    probe_rounds: int = 3
    probe_within: float = 1.5
    rounds: dict[Arrangement, int] = field(init=False)
    switches: int = field(init=False, default=0)
    _figures: dict[int, dict[Arrangement, Figures]] = field(init=False)
    _tokens: dict[int, RoundTokens] = field(init=False)
    _held: dict[int, Arrangement] = field(init=False)
    _calibrating: set[int] = field(init=False)
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
        if self.probe_within <= 1.0:
            raise ValueError(f"need probe_within > 1, got {self.probe_within}")
        self.offered = tuple(Arrangement(a) for a in self.offered)
        self.rounds = {a: 0 for a in Arrangement}
        self._figures, self._held, self._probes, self._probing = {}, {}, {}, {}
        self._tokens, self._calibrating = {}, set()
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
        if b not in self._held:
            source = None if b in self._calibrating else self._nearest_held(b)
            if source is not None:  # the others are measured by probes
                self._held[b] = self._held[source]
                logger.info("SSD: b<=%d holds %s, as b<=%d does", b, self._held[b], source)
            else:
                self._calibrating.add(b)
                for arrangement in self.offered:  # each measured here, in offered order
                    if self._measured(b, arrangement) < self.calibration_rounds:
                        return arrangement
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
            if other is not None:
                if other in self._figures.get(b, {}):
                    self._figures[b][other].fresh = True
                self._probing[b] = [other, self.probe_rounds - 1]
                return other
        return preferred

    def _nearest_held(self, b: int) -> int | None:
        """The held bucket nearest to `b` (the smaller of two as near), None before any."""
        held = sorted(self._held, key=lambda h: (abs(math.log2(h / b)), h))
        return held[0] if held else None

    def _probe_target(self, b: int) -> Arrangement | None:
        """The arrangement a probe at bucket `b` runs: of those not held and not measured
        there, or rated within `probe_within` of the held one, the one probed least recently
        (the order of `offered`, rotating); None when none is. Tokens are live for every
        arrangement (shared figures), so a probe only re-measures a round time, which would
        have to shrink by that factor."""
        held = self._held[b]
        floor = (self.rate(held, b) or 0.0) / self.probe_within
        others = [
            a for a in self.offered if a != held and (self.rate(a, b) or float("inf")) >= floor
        ]
        if not others:
            return None
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
        tokens = self.horizon_rounds * (self.tokens(best, b) or 1.0)
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

    def tokens(self, arrangement: Arrangement, b: int) -> float | None:
        """Tokens per request a round of `arrangement` commits at bucket `b` (`RoundTokens`);
        None before what it needs is measured."""
        figures = self._tokens.get(b)
        return None if figures is None else figures.tokens(arrangement)

    def rate(self, arrangement: Arrangement, b: int) -> float | None:
        """Tokens per request per second of `arrangement` at bucket `b`; None before a
        measured round there."""
        figures = self._figures.get(b, {}).get(arrangement)
        seconds = None if figures is None else figures.seconds.value
        tokens = self.tokens(arrangement, b)
        return None if not seconds or tokens is None else tokens / seconds

    def _measured(self, b: int, arrangement: Arrangement) -> int:
        figures = self._figures.get(b, {}).get(arrangement)
        return 0 if figures is None else figures.seconds.count

    # ------------------------------------------------------------------ measurements
    def observe(
        self,
        arrangement: Arrangement,
        batch_size: int,
        round_s: float,
        tokens: Sequence[float],
        sources: Sequence[str],
        rated: bool = True,
    ) -> None:
        """Fold in one finished round: its figures, or, as the first round after a change of
        arrangement, the switch's cost (neither for each arrangement's first round since start,
        nor for a round not `rated`: one whose requests could not all take a full chain, so
        their tokens left, not the arrangement, capped what it committed, or one where a request
        had just started).

        Args:
            arrangement: what the round ran.
            batch_size: its b >= 1.
            round_s: its wall time in seconds (> 0), scheduler time between rounds included.
            tokens: tokens it committed per request (k + 1, >= 1), batch order.
            sources: where each request's draft came from (`draft_kinds` names; "plain").
            rated: whether the round rates its arrangement (it still counts as the last run).

        Raises:
            ValueError: on a batch size < 1 or other than the requests given, a non-positive
                time, or a request with fewer than 1 token.
        """
        if (
            batch_size < 1
            or len(tokens) != batch_size
            or not (math.isfinite(round_s) and round_s > 0)
            or min(tokens) < 1
        ):
            raise ValueError(
                f"need batch_size >= 1 tokens >= 1 each, round_s > 0; got {batch_size}, "
                f"{list(tokens)}, {round_s}"
            )
        mean_tokens = sum(tokens) / batch_size
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
        self._tokens.setdefault(b, RoundTokens()).observe(arrangement, tokens, sources)
        by_arrangement = self._figures.setdefault(b, {})
        figures = by_arrangement.get(arrangement)
        if figures is None or figures.fresh:
            figures = Figures()
            by_arrangement[arrangement] = figures
        figures.seconds.add(round_s)

    # ------------------------------------------------------------------ reports
    def buckets(self) -> dict[str, dict[str, object]]:
        """Per measured bucket (its size as a string): the arrangement held ("" while
        calibrating) and each arrangement's round seconds, tokens per request per round and
        rate (tokens per request per second), for `/ssd/stats`."""
        out: dict[str, dict[str, object]] = {}
        for b in sorted(self._figures):
            row: dict[str, object] = {"held": str(self.held(b) or "")}
            for a, f in self._figures[b].items():
                row[str(a)] = {
                    "round_s": f.seconds.value or 0.0,
                    "tokens": self.tokens(a, b) or 0.0,
                    "rate": self.rate(a, b) or 0.0,
                    "rounds": f.seconds.count,
                }
            shared = self._tokens.get(b)
            if shared is not None:
                row["hit_rate"] = shared.hit.value or 0.0
            out[str(b)] = row
        return out

    def describe(self, b: int, arrangements: Sequence[Arrangement] | None = None) -> str:
        """One line of bucket `b`'s figures, e.g. "b<=1: sync (sync 7.6 tok/s = 3.40 / 0.45 s,
        async 6.1 tok/s = 3.02 / 0.50 s)" (the held arrangement first)."""
        parts = []
        for a in arrangements or self.offered:
            f, rate, tokens = self._figures.get(b, {}).get(a), self.rate(a, b), self.tokens(a, b)
            if f is not None and rate is not None and tokens is not None:
                parts.append(f"{a} {rate:.2f} tok/s = {tokens:.2f} / {f.seconds.value:.3f} s")
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

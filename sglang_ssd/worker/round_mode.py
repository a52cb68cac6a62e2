"""Speculate this decode round, or run a plain one: `RoundModePolicy` (`--ssd-plain-rounds`).

A plain round verifies no draft: one TARGET_VERIFY position per request (its root), the bonus
token sampled from p (exact: Theorem 1 with an empty draft), while the speculator is stopped and
its cores are lent to the target (`sglang_ssd.worker.core_lending`). So a plain round runs at
plain decoding's speed on all the machine's cores, and SSD is never much slower than AR: on a
2-core CPU the target alone on both cores decodes ~1.7x faster than on its own core, so
speculation pays only while it yields more than ~1.7x the tokens per round time.

The choice is measured, not modelled: per batch size b the policy keeps moving averages of the
wall time of speculative and plain rounds, and over all speculative rounds the tokens each
request gains per round (accept length, bonus included). It picks the higher rate, L / t_spec(b)
against 1 / t_plain(b), with a margin against flapping, and re-measures the other mode with a
short probe whose interval doubles while the choice holds (exponential backoff), so a change of
traffic (chat turns into code) is noticed. A batch where no request has more than one token
left to generate is always plain: no draft token could be used.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sglang_ssd.config import PLAIN_ROUNDS


class RoundMode(str, enum.Enum):
    """What a decode round does."""

    SPECULATE = "speculate"
    PLAIN = "plain"


@dataclass
class _Ema:
    """A moving average that starts at its first observation."""

    weight: float
    value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else (1.0 - self.weight) * self.value + self.weight * x


@dataclass
class RoundModePolicy:
    """Chooses each decode round's `RoundMode` from measured round rates (module docstring).

    Attributes:
        setting: "auto" (measure and choose), "never" (always speculate), "always" (always plain).
        ema_weight: weight in (0, 1] of a new observation in the moving averages.
        warmup_rounds: speculative rounds measured before the first plain probe.
        probe_rounds: rounds per probe of plain rounds; a probe of speculation takes
            `spec_probe_rounds`, since its cache warms up only after the switch.
        settle_rounds: rounds after a switch to each mode that are not measured (they pay the
            switch: after plain rounds the speculator drafts just in time, then rebuilds its
            cache); the keys are `RoundMode` values.
        backoff_min, backoff_max: rounds between probes; doubles from min to max each time a
            probe confirms the choice, back to min when it changes it.
        margin: the other mode must be rated this factor faster to take over (≥ 1).

    Raises:
        ValueError: on an unknown setting or out-of-range parameters.
    """

    setting: str = "auto"
    ema_weight: float = 0.3
    warmup_rounds: int = 6
    probe_rounds: int = 3
    spec_probe_rounds: int = 8
    settle_rounds: dict[str, int] = field(default_factory=lambda: {"speculate": 2, "plain": 1})
    backoff_min: int = 16
    backoff_max: int = 256
    margin: float = 1.05
    _tokens: _Ema = field(init=False)
    _times: dict[RoundMode, dict[int, _Ema]] = field(init=False)
    _current: RoundMode = field(init=False, default=RoundMode.SPECULATE)
    _probe_left: int = field(init=False, default=0)
    _since_probe: int = field(init=False, default=0)
    _backoff: int = field(init=False)
    _probed: bool = field(init=False, default=False)
    _last: RoundMode | None = field(init=False, default=None)
    _run: int = field(init=False, default=0)  # rounds of `_last`'s mode in a row
    rounds: dict[RoundMode, int] = field(init=False)

    def __post_init__(self) -> None:
        if self.setting not in PLAIN_ROUNDS:
            raise ValueError(f"setting must be one of {PLAIN_ROUNDS}, got {self.setting!r}")
        if not 0.0 < self.ema_weight <= 1.0:
            raise ValueError(f"ema_weight must be in (0, 1], got {self.ema_weight}")
        settle = self.settle_rounds
        if self.warmup_rounds < 1 or set(settle) != {m.value for m in RoundMode}:
            raise ValueError("warmup_rounds must be >= 1 and settle_rounds name both modes")
        probes = {"plain": self.probe_rounds, "speculate": self.spec_probe_rounds}
        if any(probes[m] <= settle[m] or settle[m] < 0 for m in probes):
            raise ValueError("each probe must outlast its mode's settle rounds")
        if not 1 <= self.backoff_min <= self.backoff_max or self.margin < 1.0:
            raise ValueError("need 1 <= backoff_min <= backoff_max and margin >= 1")
        self._tokens = _Ema(self.ema_weight)
        self._times = {mode: {} for mode in RoundMode}
        self._backoff = self.backoff_min
        self.rounds = {mode: 0 for mode in RoundMode}

    # ------------------------------------------------------------------ choice
    def choose(self, batch_size: int, tokens_left: Sequence[int]) -> RoundMode:
        """The mode of the next decode round.

        Args:
            batch_size: b >= 1, requests in the round.
            tokens_left: per request, tokens it may still generate (max_new_tokens minus its
                output so far); a round where every entry is <= 1 is plain (unless "never").

        Raises:
            ValueError: if batch_size < 1.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self.setting != "auto":
            mode = RoundMode.PLAIN if self.setting == "always" else RoundMode.SPECULATE
        elif tokens_left and max(tokens_left) <= 1:
            mode = RoundMode.PLAIN
        else:
            mode = self._auto(batch_size)
        self.rounds[mode] += 1
        return mode

    def _auto(self, batch_size: int) -> RoundMode:
        if self._probe_left > 0:
            self._probe_left -= 1
            return self._other(self._current)
        preferred = self._preferred(batch_size)
        if preferred is not None and preferred != self._current:
            self._current = preferred
            self._since_probe = 0
            self._backoff = self.backoff_min
        elif self._probed:  # the probe confirmed the choice: probe half as often
            self._backoff = min(2 * self._backoff, self.backoff_max)
        self._probed = False
        self._since_probe += 1
        other = self._other(self._current)
        interval = self.warmup_rounds if not self._times[other] else self._backoff
        if self._since_probe > interval:
            return self._start_probe()
        return self._current

    def _start_probe(self) -> RoundMode:
        """The first round of a probe of the mode not in use."""
        other = self._other(self._current)
        length = self.spec_probe_rounds if other == RoundMode.SPECULATE else self.probe_rounds
        self._since_probe = 0
        self._probe_left = length - 1
        self._probed = True
        return other

    def note_arrival(self) -> None:
        """New requests joined (a prefill ran): if plain rounds are in use, speculation is
        probed from the next round on, since the newcomers' acceptance is unknown."""
        if self.setting == "auto" and self._current == RoundMode.PLAIN and not self._probe_left:
            self._since_probe = self._backoff  # `_auto` starts the probe at the next round

    def _preferred(self, batch_size: int) -> RoundMode | None:
        """The mode rated faster at this batch size (None until both are measured); the mode in
        use keeps its place unless the other is `margin` times faster."""
        spec = self.rate(RoundMode.SPECULATE, batch_size)
        plain = self.rate(RoundMode.PLAIN, batch_size)
        if spec is None or plain is None:
            return None
        if self._current == RoundMode.SPECULATE:
            return RoundMode.PLAIN if plain > self.margin * spec else RoundMode.SPECULATE
        return RoundMode.SPECULATE if spec > self.margin * plain else RoundMode.PLAIN

    @property
    def plain_now(self) -> bool:
        """Whether plain rounds are the mode in use ("always", or "auto" that chose them): then
        prefill forwards borrow the speculator's cores too."""
        return self.setting == "always" or (
            self.setting == "auto" and self._current == RoundMode.PLAIN
        )

    def rate(self, mode: RoundMode, batch_size: int) -> float | None:
        """Measured tokens per request per second of `mode` at (the nearest measured) batch
        size, or None before the first measurement."""
        t = self._time(mode, batch_size)
        if t is None or t <= 0:
            return None
        if mode == RoundMode.PLAIN:
            return 1.0 / t
        tokens = self._tokens.value
        return None if tokens is None else tokens / t

    def _time(self, mode: RoundMode, batch_size: int) -> float | None:
        known = {b: e.value for b, e in self._times[mode].items() if e.value is not None}
        if not known:
            return None
        nearest = min(known, key=lambda b: (abs(math.log(b / batch_size)), b))
        return known[nearest]

    @staticmethod
    def _other(mode: RoundMode) -> RoundMode:
        return RoundMode.PLAIN if mode == RoundMode.SPECULATE else RoundMode.SPECULATE

    # ------------------------------------------------------------------ measurements
    def observe(
        self, mode: RoundMode, batch_size: int, round_s: float, tokens_per_request: float
    ) -> None:
        """Fold in one finished round (the `settle_rounds` after a switch are skipped: they pay
        the switch, not the mode's steady rate).

        Args:
            mode: what the round did.
            batch_size: its b >= 1.
            round_s: its wall time in seconds (> 0), scheduler time between rounds included.
            tokens_per_request: mean tokens committed per request (bonus included, >= 1).

        Raises:
            ValueError: on a non-positive time or batch size, or fewer than 1 token.
        """
        if batch_size < 1 or not (math.isfinite(round_s) and round_s > 0):
            raise ValueError(f"need batch_size >= 1 and round_s > 0, got {batch_size}, {round_s}")
        if tokens_per_request < 1.0:
            raise ValueError(f"tokens_per_request must be >= 1, got {tokens_per_request}")
        self._run = self._run + 1 if mode == self._last else 1
        self._last = mode
        if self._run <= self.settle_rounds[mode.value]:
            return
        self._times[mode].setdefault(batch_size, _Ema(self.ema_weight)).add(round_s)
        if mode == RoundMode.SPECULATE:
            self._tokens.add(tokens_per_request)

    def stats(self) -> dict[str, float]:
        """For `/ssd/stats`: rounds by mode, the mode in use (1 = plain) and the measured rates
        at batch size 1 (tokens per request per second; 0 before a measurement)."""
        return {
            "plain_rounds": float(self.rounds[RoundMode.PLAIN]),
            "speculative_rounds": float(self.rounds[RoundMode.SPECULATE]),
            "plain_mode": float(self.plain_now),
            "rate_speculate_b1": self.rate(RoundMode.SPECULATE, 1) or 0.0,
            "rate_plain_b1": self.rate(RoundMode.PLAIN, 1) or 0.0,
            "spec_tokens_per_round": self._tokens.value or 0.0,
        }

"""Exponential moving averages: the one rule every online estimate here uses (the fallback
policy's p_hit, acceptance and latencies; the depth tuner's forward times; the round-mode
policy's round times).

Each caller names its own weight where it is used (how fast it forgets); the rule is this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def ema(old: float | None, new: float, weight: float) -> float:
    """The moving average after observing `new`: `new` itself when there is no `old` yet, else
    ``(1 - weight) * old + weight * new``.

    Args:
        old: the average so far (None: nothing observed yet).
        new: the observation (any unit; the caller's).
        weight: in (0, 1], the share of the new observation.

    Raises:
        ValueError: if `weight` is outside (0, 1].
    """
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"a moving average's weight must be in (0, 1], got {weight}")
    return new if old is None else (1.0 - weight) * old + weight * new


@dataclass
class Ema:
    """A moving average that starts at its first observation (`weight` of each new one), with
    the number of observations folded in."""

    weight: float
    value: float | None = None
    count: int = 0

    def add(self, x: float) -> None:
        """Fold in one observation `x` (`ema`)."""
        self.value = ema(self.value, x, self.weight)
        self.count += 1


@dataclass
class RecentMedian:
    """The median of the last `window` observations (the lower middle one of an even count),
    with the number of observations folded in: for times whose outliers all lie above (a
    one-time cost, another process on a lent core), which would drag a moving average.

    Raises:
        ValueError: on a window below 1.
    """

    window: int
    count: int = 0
    _recent: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"a median's window must be >= 1, got {self.window}")

    def add(self, x: float) -> None:
        """Fold in one observation `x`."""
        self._recent = [*self._recent[1 - self.window :], x] if self.window > 1 else [x]
        self.count += 1

    @property
    def value(self) -> float | None:
        """The median so far; None before any observation."""
        if not self._recent:
            return None
        ordered = sorted(self._recent)
        return ordered[(len(ordered) - 1) // 2]

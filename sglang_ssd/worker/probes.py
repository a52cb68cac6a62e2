"""When a measured choice re-probes the option it is not using: `ProbeSchedule`.

The arrangement policy (`arrangement_policy`: async, sync or plain per batch-size bucket) holds
the arrangement its measurements rate fastest, but what it measured can go stale (the requests'
text turns more or less predictable), so now and then it runs another for a few rounds to
measure it again. The intervals double while the probes confirm the choice
(exponential backoff), so a settled choice pays little for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProbeSchedule:
    """Probes of `rounds` rounds each, after more than `backoff` rounds held since the last one
    (or since the choice changed); `backoff` starts at `backoff_min` and doubles after each
    probe up to `backoff_max`.

    Raises:
        ValueError: unless rounds >= 1 and 1 <= backoff_min <= backoff_max.
    """

    rounds: int = 4
    backoff_min: int = 16
    backoff_max: int = 256
    _left: int = field(init=False, default=0)
    _since: int = field(init=False, default=0)
    backoff: int = field(init=False)

    def __post_init__(self) -> None:
        if self.rounds < 1 or not 1 <= self.backoff_min <= self.backoff_max:
            raise ValueError("need probe rounds >= 1 and 1 <= backoff_min <= backoff_max")
        self.backoff = self.backoff_min

    def probing(self) -> bool:
        """Whether the next round belongs to a probe under way (it takes one of its rounds)."""
        if self._left > 0:
            self._left -= 1
            return True
        return False

    def changed(self, reset_backoff: bool = True) -> None:
        """The choice changed: count the rounds held from now (and, with `reset_backoff`, wait
        `backoff_min` again)."""
        self._since = 0
        if reset_backoff:
            self.backoff = self.backoff_min

    def due(self, min_spacing: int = 0) -> bool:
        """Count one more round held; True when a probe starts with it (more than
        max(`backoff`, `min_spacing`) rounds held), and then `probing` gives its other rounds."""
        self._since += 1
        if self._since <= max(self.backoff, min_spacing):
            return False
        self._since = 0
        self.backoff = min(2 * self.backoff, self.backoff_max)
        self._left = self.rounds - 1
        return True

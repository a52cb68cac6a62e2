"""Where a round's time goes, by phase, on either side of the link.

Both the speculator (glue forward, each tree depth's forward, LM head, sampling, cache populate,
outcome lookup, packing, send) and the target worker (waiting for drafts, building the verify
batch, the verify forward, `saguaro.verify`, KV moves and logprobs, scheduler time between
rounds) accumulate wall-clock seconds per phase in a `PhaseTimer`; `/ssd/stats` shows them as
per-round means and the decode log line names the largest ones.

Times are `time.perf_counter` seconds on the host. On a GPU a host clock alone reads launch
times, so a timer made for a CUDA device (`PhaseTimer.for_device`) synchronises the device at
every phase boundary: each phase then holds the GPU work it launched, and the verify time, the
speculator's round (T_p), the depth tuner and the fallback policy, which read these phases, see
GPU time. The cost is one `torch.cuda.synchronize` per boundary, a few per
round.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Running totals of seconds (and entries) per phase name. Phases never nest, so that a
    round's phases add up to its time: entering one inside another raises RuntimeError.

    Attributes:
        seconds: phase name -> total seconds.
        calls: phase name -> times the phase was entered.
        last: phase name -> seconds of its latest entry (kept by `take`).
        sync: called at each phase's start and end, before the clock is read (None: the host
            clock alone; `for_device` gives a CUDA device's synchronise).
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.last: dict[str, float] = {}
        self.active: str | None = None
        self.sync = sync

    @classmethod
    def for_device(cls, device: torch.device | str) -> PhaseTimer:
        """A timer for work on `device`: synchronising at phase boundaries on CUDA."""
        return cls(device_sync(device))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the `with` block as `name`.

        Raises:
            RuntimeError: when entered inside another phase (it would be counted twice).
        """
        if self.active is not None:
            raise RuntimeError(f"phase {name!r} entered inside phase {self.active!r}")
        self.active = name
        if self.sync is not None:
            self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.active = None
            if self.sync is not None:
                self.sync()
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        """Add `seconds` (>= 0) to `name`."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.last[name] = seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    def merge(self, seconds: Mapping[str, float]) -> None:
        """Add a mapping of phase -> seconds (e.g. the speculator's, received per round)."""
        for name, value in seconds.items():
            self.add(name, value)

    def take(self) -> dict[str, float]:
        """The seconds since the previous `take` (or start), and reset them to zero."""
        out = dict(self.seconds)
        self.seconds.clear()
        self.calls.clear()
        return out

    def means(self, rounds: int) -> dict[str, float]:
        """Seconds per round of each phase over `rounds` rounds (0 rounds: the totals). Safe to
        call from another thread while phases are added (`dict()` copies under the GIL)."""
        snapshot = dict(self.seconds)
        return {name: value / max(rounds, 1) for name, value in sorted(snapshot.items())}


def device_sync(device: torch.device | str) -> Callable[[], None] | None:
    """`torch.cuda.synchronize` bound to `device` when it is a CUDA device, else None (CPU work
    is done when the call returns)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return functools.partial(torch.cuda.synchronize, device)


def largest(means: Mapping[str, float], n: int = 3) -> str:
    """The `n` largest phases as ``"name 12.3 ms, ..."`` (for the decode log line)."""
    top = sorted(means.items(), key=lambda kv: kv[1], reverse=True)[:n]
    return ", ".join(f"{name} {value * 1e3:.1f} ms" for name, value in top)

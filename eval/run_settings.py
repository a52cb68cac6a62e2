"""What a run is besides its configurations (`RunSettings`), and the servers a caller may hand in.

`eval.harness` (which builds a run's results document) and `eval.interleave` (which runs its
units) both read these; neither imports the other for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eval.configs import Config
from eval.sampling import Sampling
from eval.servers import Server

# Flags every server gets: an idle SGLang scheduler otherwise spins a whole core and steals it
# from the server being measured (`eval.harness`).
HARNESS_ARGS: tuple[str, ...] = ("--sleep-on-idle",)
# Running servers for the given configurations, keyed by `Config.server_name`; the caller owns them.
ServerProvider = Callable[[Sequence[Config]], Mapping[str, Server]]


@dataclass
class RunSettings:
    """Everything about a run that is not a configuration."""

    sampling: Sampling = field(default_factory=Sampling)
    batch_size: int = 1
    repeats: int = 1
    warmup: bool = True
    flush_cache: bool = True
    stream: bool = False
    concurrent_servers: bool | None = None  # None: decide from free memory
    parallel_start: bool = True  # start concurrent servers at the same time
    extra_args: tuple[str, ...] = HARNESS_ARGS
    startup_timeout: float = 900.0
    # Before each unit, wait (up to quiet_max_wait_s) until at most this fraction of all CPUs is
    # busy; None: don't wait. Each batch records the CPU time other processes used meanwhile.
    quiet_threshold: float | None = None
    quiet_max_wait_s: float = 600.0
    # Units of these sizes, in order, instead of `batch_size` each (must add up to the prompts).
    unit_sizes: tuple[int, ...] = ()

    def units(self, n_prompts: int) -> list[range]:
        """Prompt index ranges of the units: `unit_sizes` if given, else `batch_size` each.

        Raises:
            ValueError: when `unit_sizes` has a size < 1 or does not add up to `n_prompts`.
        """
        sizes = self.unit_sizes or [self.batch_size] * -(-n_prompts // self.batch_size)
        if min(sizes, default=1) < 1 or (self.unit_sizes and sum(sizes) != n_prompts):
            raise ValueError(f"unit sizes {list(sizes)} do not cover {n_prompts} prompts")
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [range(a, min(a + b, n_prompts)) for a, b in zip(starts, sizes, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampling": vars(self.sampling) | {"greedy": self.sampling.greedy},
            "batch_size": self.batch_size,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "flush_cache": self.flush_cache,
            "stream": self.stream,
            "concurrent_servers": self.concurrent_servers,
            "parallel_start": self.parallel_start,
            "extra_args": list(self.extra_args),
            "quiet_threshold": self.quiet_threshold,
            "quiet_max_wait_s": self.quiet_max_wait_s,
            "unit_sizes": list(self.unit_sizes),
        }

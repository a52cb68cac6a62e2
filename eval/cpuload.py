"""CPU time accounting: how much of the machine a measurement had to itself.

On a shared machine other processes steal cores from the server being measured, and on two
cores that dominates the result (an OpenMP decode step with one of its two threads descheduled
waits for it). Each batch therefore records the machine's busy CPU time, the measured server's
own CPU time and the difference ("foreign" CPU: other processes, including our idle servers),
and the harness can wait for a quiet machine before each unit. For a pinned server "the
machine" is its CPUs only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def machine_busy_s(cpus: Collection[int] | None = None) -> float:
    """CPU seconds spent not idle since boot, summed over `cpus` (all CPUs when None)."""
    total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if cpus is None and name != "cpu":
            continue
        if cpus is not None and not (name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        total += user + nice + system + irq + softirq + steal
    return total / TICK


def process_cpu_s(pids: Iterable[int]) -> float:
    """User + system CPU seconds of `pids` (processes that are gone count as 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICK


@dataclass
class CpuSample:
    """A point in time: machine busy CPU, the measured processes' CPU, ours, the clock."""

    busy_s: float
    server_s: float
    self_s: float
    at: float

    @classmethod
    def take(cls, pids: Iterable[int], cpus: Collection[int] | None = None) -> CpuSample:
        """Sample now; with `cpus`, only those CPUs count as "the machine" (a pinned server)."""
        own = time.process_time() if cpus is None or _self_on(cpus) else 0.0
        return cls(machine_busy_s(cpus), process_cpu_s(pids), own, time.perf_counter())


def cpu_delta(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """CPU seconds between two samples: machine busy, measured server, and everything else."""
    busy = after.busy_s - before.busy_s
    server = after.server_s - before.server_s
    own = after.self_s - before.self_s
    return {
        "cpu_busy_s": busy,
        "server_cpu_s": server,
        "foreign_cpu_s": max(0.0, busy - server - own),
    }


def _self_on(cpus: Collection[int]) -> bool:
    """Whether this process may run on `cpus` (then its CPU time is not "foreign" there)."""
    return bool(os.sched_getaffinity(0) & set(cpus))


def busy_fraction(window_s: float = 1.0, cpus: Collection[int] | None = None) -> float:
    """Fraction of `cpus` (all CPUs when None) busy over the next `window_s` seconds."""
    count = len(cpus) if cpus is not None else (os.cpu_count() or 1)
    start, t0 = machine_busy_s(cpus), time.perf_counter()
    time.sleep(window_s)
    return (machine_busy_s(cpus) - start) / ((time.perf_counter() - t0) * count)


def wait_until_quiet(
    threshold: float,
    max_wait_s: float,
    window_s: float = 2.0,
    cpus: Collection[int] | None = None,
) -> float:
    """Sleep until at most `threshold` of `cpus` (all when None) is busy; returns seconds waited
    (at most about `max_wait_s`: after that the caller proceeds and the batch records it)."""
    start = time.perf_counter()
    while busy_fraction(window_s, cpus) > threshold:
        if time.perf_counter() - start > max_wait_s:
            break
    return time.perf_counter() - start

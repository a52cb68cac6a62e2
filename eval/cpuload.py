"""CPU time accounting: how much of the machine a measurement had to itself.

On a shared machine other processes steal cores from the server being measured, and on two
cores that dominates the result (an OpenMP decode step with one of its two threads descheduled
waits for it). Each batch therefore records the machine's busy CPU time, the measured server's
own CPU time and the difference ("foreign" CPU: other processes, including our idle servers),
and the harness can wait for a quiet machine before each unit. For a pinned server "the
machine" is its CPUs only. The waits for a quiet machine (a busy fraction of some CPUs, or a load
average and free memory) live here too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import psutil

# CPU time that is not idle: /proc/stat's user, nice, system, irq, softirq and steal (guest time
# is already inside user and nice).
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


def machine_busy_s(cpus: Collection[int] | None = None) -> float:
    """CPU seconds spent not idle since boot, summed over `cpus` (all CPUs when None).

    CPU ids index psutil's per-CPU list, which holds the online CPUs in id order.
    """
    if cpus is None:
        rows = [psutil.cpu_times()]
    else:
        rows = [t for i, t in enumerate(psutil.cpu_times(percpu=True)) if i in cpus]
    return sum(getattr(t, name) for t in rows for name in _BUSY_FIELDS)


def process_cpu_s(pids: Iterable[int]) -> float:
    """User + system CPU seconds of `pids` (processes that are gone count as 0)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


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


def wait_while(busy: Callable[[], bool], max_wait_s: float, poll_s: float = 0.0) -> float:
    """Call `busy` until it says False, sleeping `poll_s` between calls; returns the seconds
    waited (at most about `max_wait_s`: after that the caller proceeds and records it)."""
    start = time.monotonic()
    while busy() and time.monotonic() - start < max_wait_s:
        time.sleep(poll_s)
    return time.monotonic() - start


def wait_until_quiet(
    threshold: float,
    max_wait_s: float,
    window_s: float = 2.0,
    cpus: Collection[int] | None = None,
) -> float:
    """Sleep until at most `threshold` of `cpus` (all when None) is busy over a `window_s`
    window; returns seconds waited (see `wait_while`)."""
    return wait_while(lambda: busy_fraction(window_s, cpus) > threshold, max_wait_s)


def wait_for_load(
    limit: float,
    max_wait_s: float,
    min_free_gb: float = 0.0,
    poll_s: float = 30.0,
    on_wait: Callable[[float, float], None] | None = None,
) -> dict[str, float]:
    """Wait until the 1-minute load average is below `limit` and at least `min_free_gb` GiB of
    memory are available (see `wait_while`); `on_wait(load, free_gb)` before each sleep.

    Returns:
        waited_s, and the loadavg_1m and available_gb it went ahead with.
    """

    def busy() -> bool:
        load, free_gb = psutil.getloadavg()[0], psutil.virtual_memory().available / 2**30
        if load < limit and free_gb >= min_free_gb:
            return False
        if on_wait is not None:
            on_wait(load, free_gb)
        return True

    waited = wait_while(busy, max_wait_s, poll_s)
    return {
        "waited_s": waited,
        "loadavg_1m": psutil.getloadavg()[0],
        "available_gb": psutil.virtual_memory().available / 2**30,
    }

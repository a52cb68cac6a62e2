"""CPU placement: on CPU "its own device" means its own cores (DESIGN.md §2).

`pin_process` pins every thread of the calling process (Linux `sched_setaffinity` applies per
thread, and OpenMP pools may already exist) and sets torch's intra-op thread count to match.
`split_cpus` decides the default split: the speculator gets the last core, the target the rest.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import torch


def available_cpus() -> list[int]:
    """The cores this process may run on, sorted."""
    return sorted(os.sched_getaffinity(0))


def machine_cpus() -> list[int]:
    """Every core of the machine (a child may re-pin to cores its parent gave up)."""
    return list(range(os.cpu_count() or 1))


def pin_process(cpus: Iterable[int]) -> list[int]:
    """Pin all threads of this process to `cpus` and use that many torch threads.

    Returns:
        The sorted CPU list applied.

    Raises:
        ValueError: if `cpus` is empty or names a core this process may not use.
    """
    wanted = sorted(set(cpus))
    allowed = set(machine_cpus())
    if not wanted or not set(wanted) <= allowed:
        raise ValueError(f"cannot pin to CPUs {wanted}; allowed: {sorted(allowed)}")
    for tid in _thread_ids():
        with contextlib.suppress(ProcessLookupError, PermissionError):  # a thread just exited
            os.sched_setaffinity(tid, wanted)
    os.sched_setaffinity(0, wanted)
    torch.set_num_threads(len(wanted))
    return wanted


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def split_cpus(draft_cpus: Iterable[int] | None) -> tuple[list[int], list[int]]:
    """(target cpus, draft cpus): `draft_cpus` if given, else the last available core.

    With a single available core both share it (the synchronous baseline on one core, where
    target and draft never run at the same time).

    Raises:
        ValueError: when the draft would take every core of several, or names cores outside
            the available set.
    """
    cpus = available_cpus()
    if draft_cpus is None and len(cpus) == 1:
        return cpus, cpus
    draft = sorted(set(draft_cpus)) if draft_cpus is not None else cpus[-1:]
    target = [c for c in cpus if c not in draft]
    if not target or not set(draft) <= set(cpus):
        raise ValueError(
            f"SSD on CPU needs disjoint cores for target and speculator: available {cpus}, "
            f"speculator {draft} (set --ssd-draft-cpus)"
        )
    return target, draft

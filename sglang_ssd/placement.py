"""Where target and speculator run: on GPU each its own device, on CPU each its own cores
(DESIGN.md §2).

`place` picks the speculator's `Placement` (and, on CPU, pins the calling target process).
`pin_process` pins every thread of the calling process (Linux `sched_setaffinity` applies per
thread, and OpenMP pools may already exist) and sets torch's intra-op thread count to match.
`split_cpus` decides the default split: the speculator gets the last core, the target the rest.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from sglang_ssd.config import SSDConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where the speculator runs: `device` ("cpu" / "cuda:N") and, on CPU, its cores `cpus`
    and the target's `target_cpus` (empty on GPU)."""

    device: str
    cpus: tuple[int, ...] | None
    target_cpus: tuple[int, ...] = ()


def place(config: SSDConfig, target_device: str) -> Placement:
    """The speculator's placement next to a target on `target_device`.

    On CUDA: `--ssd-draft-device`, else the GPU after the target's (the target's own when it is
    the last). On CPU: the cores of `split_cpus(--ssd-draft-cpus)`; the calling (target) process
    is pinned to the other cores.

    Raises:
        ValueError: from `split_cpus` / `pin_process` on an impossible CPU split.
    """
    if target_device.startswith("cuda"):
        device = config.draft_device
        if device is None:
            index = torch.cuda.current_device() + 1
            device = f"cuda:{index}" if index < torch.cuda.device_count() else target_device
        return Placement(device=device, cpus=None)
    target_cpus, draft_cpus = split_cpus(config.draft_cpus, take_turns=config.mode == "sync")
    pin_process(target_cpus)
    logger.info("SSD: target pinned to CPUs %s, speculator to %s", target_cpus, draft_cpus)
    return Placement(
        device=config.draft_device or "cpu", cpus=tuple(draft_cpus), target_cpus=tuple(target_cpus)
    )


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


def split_cpus(
    draft_cpus: Iterable[int] | None, take_turns: bool = False
) -> tuple[list[int], list[int]]:
    """(target cpus, draft cpus): `draft_cpus` if given, else the last available core.

    With a single available core both share it (the synchronous baseline on one core, where
    target and draft never run at the same time). With `take_turns` (`--ssd-mode sync`, where
    they never do), `draft_cpus` naming every available core gives both every core (SYNC-2c).

    Raises:
        ValueError: when the draft would take every core of several (unless they take turns),
            or names cores outside the available set.
    """
    cpus = available_cpus()
    if draft_cpus is None and len(cpus) == 1:
        return cpus, cpus
    if take_turns and draft_cpus is not None and sorted(set(draft_cpus)) == cpus:
        return cpus, cpus
    draft = sorted(set(draft_cpus)) if draft_cpus is not None else cpus[-1:]
    target = [c for c in cpus if c not in draft]
    if not target or not set(draft) <= set(cpus):
        raise ValueError(
            f"SSD on CPU needs disjoint cores for target and speculator: available {cpus}, "
            f"speculator {draft} (set --ssd-draft-cpus; only --ssd-mode sync may give both "
            "every core)"
        )
    return target, draft

"""Where target and speculator run: on GPU each its own device, on CPU each its own cores
(docs/design.md#cores-and-devices).

`place` picks the speculator's `Placement` (and, on CPU, pins the calling target process).
`pin_process` pins every thread of the calling process (Linux `sched_setaffinity` applies per
thread, and OpenMP pools may already exist) and sets torch's intra-op thread count to match;
`widened` does it for the span of a block (the speculator's cores lent to the target) and pins
back after.
`split_cpus` decides the default split: the speculator gets the last core, the target the rest
(of the replica's cores with `--dp-size` > 1: `replica_cpus`).
`TargetGpus` and `draft_gpu` decide the default GPU and refuse collisions with the target's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.launch.replica_cpus import replica_cores

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where the speculator runs: `device` ("cpu" / "cuda:N") and, on CPU, its cores `cpus`
    and the target's `target_cpus` (empty on GPU); `dp_rank` is the DP replica it serves
    (passed to the speculator as `--dp-rank`)."""

    device: str
    cpus: tuple[int, ...] | None
    target_cpus: tuple[int, ...] = ()
    dp_rank: int = 0


@dataclass(frozen=True)
class TargetGpus:
    """The GPUs SGLang 0.5.23 gives a server's target ranks (one node).

    `DataParallelController.launch_dp_schedulers` starts replica r at
    `r * tp_size * pp_size * gpu_id_step`, and within it `launch_tensor_parallel_group` puts
    (pp, tp) on `base_gpu_id + start + pp * tp_size + tp * gpu_id_step` (engine.py does the
    same without DP). Attributes are those server flags (`--base-gpu-id`, `--tp-size`,
    `--pp-size`, `--dp-size`, `--gpu-id-step`).
    """

    base_gpu_id: int = 0
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    gpu_id_step: int = 1

    @classmethod
    def of(cls, server_args: Any) -> TargetGpus:
        """From SGLang's server args (missing or None fields take the defaults)."""

        def get(name: str, default: int) -> int:
            value = getattr(server_args, name, None)
            return default if value is None else int(value)

        return cls(
            get("base_gpu_id", 0),
            get("tp_size", 1),
            get("pp_size", 1),
            get("dp_size", 1),
            get("gpu_id_step", 1),
        )

    def replica(self, dp_rank: int) -> tuple[int, ...]:
        """The GPU ids of DP replica `dp_rank`'s ranks, sorted."""
        start = self.base_gpu_id + dp_rank * self.tp_size * self.pp_size * self.gpu_id_step
        return tuple(
            sorted(
                start + pp * self.tp_size + tp * self.gpu_id_step
                for pp in range(self.pp_size)
                for tp in range(self.tp_size)
            )
        )

    def all(self) -> tuple[int, ...]:
        """Every GPU id of the server's target ranks, all replicas, sorted."""
        return tuple(sorted({g for r in range(self.dp_size) for g in self.replica(r)}))

    def dp_rank_of(self, gpu_id: int) -> int:
        """The replica whose ranks include `gpu_id`.

        Raises:
            ValueError: when no replica runs on `gpu_id`.
        """
        for rank in range(self.dp_size):
            if gpu_id in self.replica(rank):
                return rank
        raise ValueError(f"GPU {gpu_id} runs no target rank of {self}")


def draft_gpu(config: SSDConfig, gpus: TargetGpus, dp_rank: int, device_count: int) -> str:
    """The CUDA device of replica `dp_rank`'s speculator: `--ssd-draft-device`, else the first
    GPU after every target rank of the server, one per replica (max(`gpus.all()`) + 1 +
    dp_rank). "After the replica's TP group" alone (base + tp_size) would be the next
    replica's first GPU under `--dp-size` > 1, so the speculators come after all of them.

    Raises:
        ValueError: the device is one of the target's GPUs (NCCL refuses two ranks on one GPU,
            and the two would fight over its memory), a GPU the machine lacks, or (with
            `--dp-size` > 1) one device named for every replica's speculator.
    """
    target = gpus.all()
    if config.draft_device is not None:
        index = torch.device(config.draft_device).index or 0
        if gpus.dp_size > 1:
            raise ValueError(
                f"--ssd-draft-device {config.draft_device} would put the speculators of all "
                f"{gpus.dp_size} DP replicas on one GPU; leave it unset (each replica's "
                f"speculator then takes its own GPU after the target's {list(target)})"
            )
    else:
        index = target[-1] + 1 + dp_rank
    if index in target:
        raise ValueError(
            f"the speculator's GPU cuda:{index} is one of the target's GPUs {list(target)}: "
            "NCCL refuses two ranks on one GPU, so give the speculator a GPU of its own with "
            "--ssd-draft-device cuda:N, or --ssd-draft-device cpu to run it on CPU cores "
            "(GPU memory for a shared device is not reserved)"
        )
    if index >= device_count:
        raise ValueError(
            f"the speculator needs a GPU of its own after the target's {list(target)}, "
            f"but cuda:{index} does not exist ({device_count} visible): set "
            "--ssd-draft-device cuda:N to a free GPU, or --ssd-draft-device cpu to run the "
            "speculator on CPU cores"
        )
    return f"cuda:{index}"


def place(
    config: SSDConfig,
    target_device: str,
    gpus: TargetGpus | None = None,
    dp_rank: int | None = None,
) -> Placement:
    """The speculator's placement next to a target on `target_device`, for DP replica
    `dp_rank` (default: the replica whose ranks include the target's GPU; 0 on CPU).

    On CUDA: `--ssd-draft-device cpu` runs it on CPU cores (unpinned); otherwise `draft_gpu`
    for the replica (`gpus`: the server's GPUs; default: a lone target on `target_device`).
    On CPU: the cores of `split_cpus(--ssd-draft-cpus)` among the replica's cores (every
    available core with one replica; with `--dp-size` > 1 its leading rank's entry of
    `SGLANG_CPU_OMP_THREADS_BIND`, `replica_cpus.replica_cores`); the calling (target)
    process is pinned to the other cores.

    Raises:
        ValueError: from `draft_gpu` (a collision or a missing GPU), a `dp_rank` whose replica
            does not run on the target's GPU, or from `split_cpus` / `pin_process` /
            `replica_cores` on an impossible CPU split.
    """
    if target_device.startswith("cuda"):
        if config.draft_device == "cpu":
            return Placement(device="cpu", cpus=None, dp_rank=dp_rank or 0)
        index = torch.device(target_device).index
        gpu_id = torch.cuda.current_device() if index is None else index
        gpus = gpus or TargetGpus(base_gpu_id=gpu_id)
        if dp_rank is None:
            dp_rank = gpus.dp_rank_of(gpu_id)
        elif gpu_id not in gpus.replica(dp_rank):
            raise ValueError(
                f"DP replica {dp_rank} runs on GPUs {list(gpus.replica(dp_rank))}, not on the "
                f"target's cuda:{gpu_id} ({gpus})"
            )
        device = draft_gpu(config, gpus, dp_rank, torch.cuda.device_count())
        logger.info("SSD: DP%d target on cuda:%d, speculator on %s", dp_rank, gpu_id, device)
        return Placement(device=device, cpus=None, dp_rank=dp_rank)
    dp_rank = dp_rank or 0
    cpus = available_cpus()
    if gpus is not None and gpus.dp_size > 1:
        cpus = replica_cores(gpus.replica(dp_rank)[0])
    target_cpus, draft_cpus = split_cpus(
        config.draft_cpus, take_turns=config.mode == "sync", cpus=cpus
    )
    pin_process(target_cpus)
    logger.info(
        "SSD: DP%d target pinned to CPUs %s, speculator to %s", dp_rank, target_cpus, draft_cpus
    )
    return Placement(
        device=config.draft_device or "cpu",
        cpus=tuple(draft_cpus),
        target_cpus=tuple(target_cpus),
        dp_rank=dp_rank,
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


@contextlib.contextmanager
def widened(own: Sequence[int], extra: Sequence[int]) -> Iterator[None]:
    """Within the block this process runs on `own` plus `extra` cores with as many torch
    threads; after it (also when it raises) it is pinned back to `own`. Without extra cores
    (all of `extra` already in `own`) nothing changes.

    Cost: one `sched_setaffinity` per thread of the process each way, about a millisecond in
    all for a scheduler process (`CoreLending`).

    Raises:
        ValueError: as `pin_process`, for cores this process may not use.
    """
    wider = sorted(set(own) | set(extra))
    if len(wider) == len(set(own)):
        yield
        return
    pin_process(wider)
    try:
        yield
    finally:
        pin_process(own)


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def split_cpus(
    draft_cpus: Iterable[int] | None,
    take_turns: bool = False,
    cpus: Iterable[int] | None = None,
) -> tuple[list[int], list[int]]:
    """(target cpus, draft cpus) among `cpus` (default: the available cores): `draft_cpus` if
    given, else the last of them.

    With a single available core both share it (the synchronous baseline on one core, where
    target and draft never run at the same time). With `take_turns` (`--ssd-mode sync`, where
    they never do), `draft_cpus` naming every available core gives both every core (SYNC-2c).

    Raises:
        ValueError: when the draft would take every core of several (unless they take turns),
            or names cores outside the available set.
    """
    cpus = available_cpus() if cpus is None else sorted(set(cpus))
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

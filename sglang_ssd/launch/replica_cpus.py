"""The CPU cores of each data-parallel replica (`--dp-size N` on CPU).

SGLang 0.5.23 gives each rank of a CPU server one entry of `SGLANG_CPU_OMP_THREADS_BIND`
('|'-separated core lists), indexed by the rank's device id (replica r's TP rank t at
`TargetGpus.replica(r)`), and without it refuses more ranks than NUMA nodes
(`numa_utils.init_threads_binding` asserts). It binds threads to its entry only on AMX machines
(Intel's sgl_kernel); sglang-ssd pins each replica's target and speculator itself: replica r's
leading rank (TP rank 0) and its speculator split that rank's entry (`placement.place`: the
speculator takes the last core).

`plan_bind` runs once at startup in the launching process: it checks a user's bind list, or
returns one that cuts the available cores into N equal blocks (exported for SGLang's
subprocesses), and refuses a machine with too few cores. `replica_cores` reads a replica's
cores back in its scheduler process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from sglang_ssd.launch.cpu_lists import CpuListError, format_cpu_list, parse_cpu_list

BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
# A target core and a speculator core per replica.
MIN_REPLICA_CPUS = 2


def parse_bind(text: str) -> list[tuple[int, ...]]:
    """The core lists of a `SGLANG_CPU_OMP_THREADS_BIND` value ("0-3|4-7" -> [(0..3), (4..7)]).

    Raises:
        ValueError: naming the variable, for an empty or malformed entry.
    """
    entries = []
    for i, item in enumerate(text.split("|")):
        try:
            entries.append(parse_cpu_list(item))
        except CpuListError as exc:
            raise ValueError(f"{BIND_ENV}={text!r}: entry {i} ({item!r}): {exc}") from None
    return entries


def bind_text(entries: Sequence[Sequence[int]]) -> str:
    """`SGLANG_CPU_OMP_THREADS_BIND`'s form of `entries` ([(0, 1), (2, 3)] -> "0-1|2-3")."""
    return "|".join(format_cpu_list(entry) for entry in entries)


def check_replicas(
    replicas: Sequence[Sequence[int]], machine: Sequence[int], allow_shared: bool
) -> None:
    """Refuse replica core sets that cannot each hold a target and a speculator apart.

    Args:
        replicas: the cores of each replica's leading rank, replica order.
        machine: the cores that exist.
        allow_shared: `--ssd-allow-shared-cores` (tests only): replicas may overlap, and one
            core per replica is enough (its target and speculator then share it).

    Raises:
        ValueError: a replica with fewer than `MIN_REPLICA_CPUS` cores, a core the machine
            lacks, or two replicas on a common core (unless `allow_shared`); the message names
            `--dp-size`, `SGLANG_CPU_OMP_THREADS_BIND` and `--ssd-allow-shared-cores`.
    """
    hint = (
        f"give each replica {MIN_REPLICA_CPUS} cores of its own through {BIND_ENV} (one "
        "'|'-separated core list per rank), lower --dp-size, or, for correctness tests only, "
        "pass --ssd-allow-shared-cores"
    )
    least = 1 if allow_shared else MIN_REPLICA_CPUS
    for rank, cores in enumerate(replicas):
        if len(set(cores)) < least:
            raise ValueError(
                f"--dp-size {len(replicas)} on CPU: replica {rank} has cores {list(cores)}, but "
                f"its target and its speculator need {MIN_REPLICA_CPUS} disjoint cores; {hint}"
            )
        missing = sorted(set(cores) - set(machine))
        if missing:
            raise ValueError(
                f"--dp-size {len(replicas)} on CPU: replica {rank} names cores {missing} that "
                f"this machine lacks (it has {format_cpu_list(machine)}); {hint}"
            )
    if allow_shared:
        return
    for a in range(len(replicas)):
        for b in range(a + 1, len(replicas)):
            common = sorted(set(replicas[a]) & set(replicas[b]))
            if common:
                raise ValueError(
                    f"--dp-size {len(replicas)} on CPU: replicas {a} and {b} share cores "
                    f"{common}; {hint}"
                )


def equal_blocks(cpus: Sequence[int], count: int) -> list[tuple[int, ...]]:
    """`cpus` (sorted) cut into `count` contiguous blocks of equal size (leftovers unused)."""
    size = len(cpus) // count
    return [tuple(cpus[i * size : (i + 1) * size]) for i in range(count)]


def plan_bind(
    replicas: Sequence[Sequence[int]],
    draft_cpus: Sequence[int] | None,
    allow_shared: bool,
    environ: Mapping[str, str],
    cpus: Sequence[int],
    machine: Sequence[int],
) -> str | None:
    """The `SGLANG_CPU_OMP_THREADS_BIND` value a CPU server of several replicas
    needs: None when `environ` already holds one (checked), else `cpus` in equal blocks, one per
    replica, or, with `allow_shared` and fewer than `MIN_REPLICA_CPUS` per replica, every core
    for every replica.

    Args:
        replicas: each replica's ranks as device ids, leading rank first
            (`placement.TargetGpus.replica`).
        draft_cpus: `--ssd-draft-cpus` (refused here: one list cannot serve every replica).
        allow_shared: `--ssd-allow-shared-cores`.
        environ: the launching process's environment.
        cpus: the cores the server may use (`placement.available_cpus`).
        machine: the cores that exist (`placement.machine_cpus`).

    Raises:
        ValueError: naming the flags, for `--ssd-draft-cpus`, too few cores, a bind list that
            misses a rank or overlaps between replicas, and `--tp-size`/`--pp-size` > 1
            without a bind list.
    """
    dp = len(replicas)
    ranks = len(replicas[0])
    if draft_cpus is not None:
        raise ValueError(
            f"--ssd-draft-cpus {format_cpu_list(draft_cpus)} would put the speculators of all "
            f"{dp} DP replicas (--dp-size {dp}) on the same cores; leave it unset (each "
            f"replica's speculator then takes the last core of its replica's cores, "
            f"{BIND_ENV})"
        )
    cpus = sorted(set(cpus))
    leading = [devices[0] for devices in replicas]
    given = environ.get(BIND_ENV)
    if given:
        entries = parse_bind(given)
        needed = max(max(devices) for devices in replicas) + 1
        if len(entries) < needed:
            raise ValueError(
                f"{BIND_ENV}={given!r} has {len(entries)} entries, but --dp-size {dp} runs "
                f"ranks on device ids up to {needed - 1}: give one core list per rank"
            )
        check_replicas([entries[i] for i in leading], machine, allow_shared)
        return None
    if ranks > 1:
        raise ValueError(
            f"--dp-size {dp} with {ranks} ranks per replica (--tp-size, --pp-size) on CPU: set "
            f"{BIND_ENV} to one core list per rank ({dp * ranks} lists separated by '|'); "
            "each replica's speculator takes the last core of its TP rank 0's list"
        )
    if len(cpus) >= MIN_REPLICA_CPUS * dp:
        blocks = equal_blocks(cpus, dp)
    elif allow_shared:
        blocks = [tuple(cpus)] * dp
    else:
        raise ValueError(
            f"--dp-size {dp} on CPU needs {MIN_REPLICA_CPUS * dp} cores (a target core and a "
            f"speculator core per replica), but this server may use {len(cpus)} "
            f"({format_cpu_list(cpus)}): lower --dp-size, give the server more cores, or, for "
            "correctness tests only, pass --ssd-allow-shared-cores (replicas then share cores)"
        )
    check_replicas(blocks, machine, allow_shared)
    return bind_text(blocks)


def replica_cores(device_id: int, environ: Mapping[str, str] | None = None) -> list[int]:
    """The cores of the rank on `device_id` (its entry of `SGLANG_CPU_OMP_THREADS_BIND`),
    in a scheduler process of a `--dp-size` > 1 CPU server.

    Raises:
        ValueError: when the variable is unset (the server did not start through the checks
            of `plan_bind`) or has no entry for `device_id`.
    """
    environ = os.environ if environ is None else environ
    given = environ.get(BIND_ENV)
    if not given:
        raise ValueError(
            f"--dp-size > 1 on CPU needs {BIND_ENV} (set at startup by sglang-ssd's checks; "
            "start the server with python -m sglang_ssd.launch_server)"
        )
    entries = parse_bind(given)
    if not 0 <= device_id < len(entries):
        raise ValueError(f"{BIND_ENV}={given!r} has no entry for device id {device_id}")
    return list(entries[device_id])

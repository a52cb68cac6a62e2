"""The Linux CPU-list form (``"0-2,5"``, /proc's ``Cpus_allowed_list``): read and written by
`--ssd-draft-cpus`, the speculator's `--cpus`, `SGLANG_CPU_OMP_THREADS_BIND` and eval's `--cpus`.
Standard library only: `sglang_ssd.config` reads it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class CpuListError(ValueError):
    """A CPU list that is empty or malformed (the message names the bad item)."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse a Linux-style CPU list such as ``"1"``, ``"0-3"`` or ``"0,2-3"``.

    Returns:
        The sorted, de-duplicated CPU ids.

    Raises:
        CpuListError: on an empty list, a malformed item, a negative id or a reversed range.
    """
    cpus: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not match:
            raise CpuListError(f"{item!r} is not a CPU id or range (e.g. 1-3)")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if hi < lo:
            raise CpuListError(f"range {item!r} is reversed")
        cpus.update(range(lo, hi + 1))
    if not cpus:
        raise CpuListError("empty CPU list")
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``: the Linux CPU-list form, which `parse_cpu_list` reads
    back."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)

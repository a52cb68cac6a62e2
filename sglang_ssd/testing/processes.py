"""A server's speculator processes, found the same way whether they were exec'd by the target or
forked from the launcher's speculator zygote (`sglang_ssd.zygote`)."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from sglang_ssd.zygote import SPECULATOR_MODULE, argv_of


@dataclass(frozen=True)
class Speculator:
    """One speculator process: its `psutil.Process`, its command line's arguments, and the
    target-side process it serves (its `--parent-pid`: the scheduler, TP rank 0)."""

    process: psutil.Process
    argv: list[str]

    def arg(self, flag: str) -> str:
        """The value of `flag` on its command line. Raises ValueError if it has none."""
        return self.argv[self.argv.index(flag) + 1]

    @property
    def target(self) -> psutil.Process:
        """The scheduler it serves. Raises psutil.NoSuchProcess once that one is gone."""
        return psutil.Process(int(self.arg("--parent-pid")))


def speculators(launcher_pid: int) -> list[Speculator]:
    """The speculator processes among `launcher_pid`'s descendants (`python -m
    sglang_ssd.speculator ...`), in pid order; empty if the launcher is gone."""
    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for proc in sorted(children, key=lambda p: p.pid):
        argv = argv_of(proc.pid)
        if argv[1:3] == ["-m", SPECULATOR_MODULE]:
            found.append(Speculator(proc, argv))
    return found

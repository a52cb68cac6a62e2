"""Processes of a test: a server's speculator processes, found the same way whether they were
exec'd by the target or forked from the launcher's speculator zygote (`sglang_ssd.launch.zygote`);
and a module run to its end from the test session's zygote when there is one (`run_module`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from sglang_ssd.launch import zygote
from sglang_ssd.launch.zygote import SPECULATOR_MODULE, argv_of


def run_module(module: str, args: Sequence[str], timeout_s: float = 300.0) -> tuple[int, str]:
    """`python -m module args` to its end with this process's environment: (exit status, stdout
    and stderr interleaved). Forked from the zygote `SGLANG_SSD_ZYGOTE` names when there is one
    (a test session that starts servers has one: no second import of SGLang, ~20 s of CPU on a
    2-core AVX2 machine), else exec'd.

    Raises:
        subprocess.TimeoutExpired: after `timeout_s` s.
        sglang_ssd.launch.zygote.ZygoteError: the named zygote cannot be reached.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    path = zygote.address()
    if path is not None:
        return zygote.run(path, module, args, env, timeout_s)
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        timeout=timeout_s, env=env, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout


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

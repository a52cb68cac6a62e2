"""Whether the speculator's target-side process still runs.

An exec'd speculator is that process's child; one forked from the launcher's speculator zygote
(`sglang_ssd.launch.zygote`) is the zygote's child, so "my parent changed" is not the test: the
process itself is looked up.
"""

from __future__ import annotations

import os

import psutil


def parent_alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie (our parent always counts as alive;
    a recycled pid would count too: pids are recycled only after the whole pid space wraps)."""
    if os.getppid() == pid:
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

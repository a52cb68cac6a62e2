"""`speculator.parent.parent_alive`: a speculator forked from the launcher's zygote is not its
target's child, so it watches the target process itself (running, gone, or a zombie)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sglang_ssd.speculator.parent import parent_alive


def test_our_own_parent_and_a_running_stranger_are_alive() -> None:
    assert parent_alive(os.getppid())
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert parent_alive(stranger.pid)
    finally:
        stranger.kill()
        stranger.wait()


def test_a_zombie_and_a_reaped_process_are_gone() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    while Path(f"/proc/{done.pid}/stat").read_text().split(")")[1].split()[0] != "Z":
        time.sleep(0.05)  # exited, not reaped yet: a zombie
    assert not parent_alive(done.pid)
    done.wait()
    assert not parent_alive(done.pid)

"""`sglang_ssd.launch.fork_start`: SGLang's "spawn" children become forks of a preloaded forkserver
that see the parent's environment as it is when they start, and keep their process titles.

Each case runs in its own Python process (enable() changes that process's multiprocessing for
good), with a child target standing in for SGLang's scheduler: it reports its environment, its
parent and the title it set, as SGLang's `run_scheduler_process` sets `sglang::scheduler`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import json, os, sys


def report(path):
    import setproctitle

    setproctitle.setproctitle("sglang::scheduler")
    torch, threads = sys.modules.get("torch"), None
    if torch is not None:  # a parallel op, as a scheduler loading weights runs
        torch.ones(1 << 22).mul(2).sum()
        threads = torch.get_num_threads()
    with open(path, "w") as out:
        json.dump({"late": os.environ.get("SSD_TEST_LATE"), "ppid": os.getppid(),
                   "threads": threads,
                   "title": open(f"/proc/{os.getpid()}/cmdline").read().strip("\\0 "),
                   "preloaded": "json" in sys.modules and "child_target" in sys.modules,
                   "method": __import__("multiprocessing").get_start_method()}, out)
"""

PARENT = """
import json, multiprocessing, os, sys

from sglang_ssd.launch import fork_start

if __name__ == "__main__":  # a spawned child imports this file again
    fork_start.PRELOAD = (*fork_start.PRELOAD[:1], "child_target")  # not SGLang: 16 s less
    if sys.argv[2] == "on":
        fork_start.enable()
    threads = None
    if sys.argv[2] == "fork":  # a launcher forked from the preloaded zygote (launch/zygote.py)
        import torch

        threads = torch.get_num_threads()
        fork_start.use_fork()
        fork_start.enable()  # the launcher still calls it: it must do nothing now
        torch.ones(1 << 22).mul(2).sum()  # the launcher's own torch work before SGLang forks
    os.environ["SSD_TEST_LATE"] = "set after enable"  # as SGLang's _set_envs_and_config does
    multiprocessing.set_start_method("spawn", force=True)  # engine.py:1995
    import child_target

    child = multiprocessing.Process(target=child_target.report, args=(sys.argv[1],))
    child.start()
    child.join(60)
    print(json.dumps({"pid": os.getpid(), "method": multiprocessing.get_start_method(),
                      "threads": threads}))
"""


def _run(tmp_path: Path, mode: str) -> tuple[dict, dict]:
    (tmp_path / "child_target.py").write_text(CHILD)
    (tmp_path / "parent.py").write_text(PARENT)
    out = tmp_path / f"child-{mode}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    done = subprocess.run(
        [sys.executable, str(tmp_path / "parent.py"), str(out), mode],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1]), json.loads(out.read_text())


def test_children_fork_from_the_forkserver_with_the_parents_environment(tmp_path: Path) -> None:
    parent, child = _run(tmp_path, "on")
    assert parent["method"] == "forkserver"
    assert child["ppid"] != parent["pid"]  # the forkserver's child, not the launcher's
    assert child["preloaded"]
    assert child["late"] == "set after enable"
    assert child["title"] == "sglang::scheduler"
    assert child["method"] == "spawn"  # its own children are spawned, as SGLang asked


def test_use_fork_forks_the_children_here_and_theirs_are_spawned(tmp_path: Path) -> None:
    parent, child = _run(tmp_path, "fork")
    assert parent["method"] == "fork" and child["ppid"] == parent["pid"]
    assert child["preloaded"]
    assert child["late"] == "set after enable" and child["title"] == "sglang::scheduler"
    assert child["method"] == "spawn"  # reset at the fork: its own children are spawned
    # The launcher ran torch before the fork: with an OpenMP pool of its own, the child would
    # hang in its parallel op; it gets the launcher's thread count back.
    assert child["threads"] == parent["threads"]


def test_without_enable_sglangs_spawn_is_untouched(tmp_path: Path) -> None:
    parent, child = _run(tmp_path, "off")
    assert parent["method"] == "spawn" and child["ppid"] == parent["pid"]
    assert child["late"] == "set after enable" and child["title"] == "sglang::scheduler"


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False)])
def test_the_switch(value: str | None, on: bool) -> None:
    from sglang_ssd.launch.fork_start import SWITCH, enabled_by

    assert enabled_by({} if value is None else {SWITCH: value}) is on

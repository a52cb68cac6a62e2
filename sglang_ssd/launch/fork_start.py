"""A faster CPU start-up: SGLang's scheduler and detokenizer forked from a preloaded forkserver.

SGLang starts its scheduler and detokenizer as `multiprocessing` children with the "spawn"
method (`sglang/srt/entrypoints/engine.py:1995`, `mp.set_start_method("spawn", force=True)`),
so each child imports SGLang, torch and transformers again: about 16 s of CPU each on a 2-core
AVX2 EPYC (`python -X importtime`), after the launcher's own 18 s, one after the other. `enable`
starts Python's forkserver at once with those modules preloaded, so its import runs beside the
launcher's, and maps SGLang's "spawn" to "forkserver": each child is then a fork of a process
that has imported everything and run nothing (no thread, no OpenMP pool, no model).

A forkserver child inherits the environment the forkserver started with, while SGLang sets
variables for its children later (`_set_envs_and_config`, and around each `proc.start()`). So
the parent's whole `os.environ` travels with each child's preparation data (as `spawn` would
have given it) and is applied before the child unpickles its target. Only variables read when
a preloaded module is imported keep their value at `enable` time: `SGLANG_USE_CPU_ENGINE`
and SSD's configuration, which the launcher sets before.

CPU only: on CUDA the launcher leaves SGLang's "spawn" alone. `SGLANG_SSD_FORKSERVER=0` turns
this off.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from multiprocessing import forkserver, spawn
from typing import Any

# What the forkserver imports before it forks anything: the targets of SGLang's children, this
# module (its `prepare` patch must run in the forkserver), and SGLang's model registry, whose
# import imports every model module of SGLang (the scheduler does at its model load: ~2 s of
# CPU on the AMX Xeon; it reads SGLANG_EXTERNAL_MODEL_PACKAGE and SGLANG_DISABLED_MODEL_ARCHS
# then, so at `enable` time here).
PRELOAD = (
    "sglang_ssd.launch.fork_start",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.models.registry",
)
ENVIRON_KEY = "sglang_ssd_environ"
SWITCH = "SGLANG_SSD_FORKSERVER"


def enabled_by(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether `environ` leaves the forkserver on (`SGLANG_SSD_FORKSERVER` unset or not "0")."""
    return environ.get(SWITCH, "1") != "0"


def enable() -> None:
    """Start the forkserver now (it preloads `PRELOAD` in its own process) and make SGLang's
    later `set_start_method("spawn")` select "forkserver". Idempotent.

    Raises:
        ValueError: on a platform without the forkserver start method (not Linux or macOS).
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        raise ValueError("this platform has no forkserver start method")
    if getattr(multiprocessing.set_start_method, "_sglang_ssd", False):
        return
    spawn.get_preparation_data = _with_environ(spawn.get_preparation_data)
    original = multiprocessing.set_start_method

    def set_start_method(method: str | None, force: bool = False) -> None:
        original("forkserver" if method == "spawn" else method, force=force)

    set_start_method._sglang_ssd = True  # type: ignore[attr-defined]
    multiprocessing.set_start_method = set_start_method
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    forkserver.ensure_running()


def use_fork() -> None:
    """Make SGLang's later `set_start_method("spawn")` select "fork" in this process, for a
    launcher that already imported what SGLang's children run (one forked from a preloaded
    process: `sglang_ssd/launch/zygote.py`); `enable` then does nothing. This process runs torch
    with one thread from here on (libgomp is not fork-safe once its pool exists). Children forked
    from here get the thread count back and their multiprocessing start method reset to
    "spawn", so their own children (the DP controller's schedulers) are spawned as SGLang asked, as
    under `enable`. Idempotent.
    """
    if getattr(multiprocessing.set_start_method, "_sglang_ssd", False):
        return
    import torch

    original = multiprocessing.set_start_method
    launcher = os.getpid()
    threads = torch.get_num_threads()
    # No OpenMP thread pool in the launcher: once libgomp's pool exists, a forked child hangs
    # in its first parallel region (seen: a scheduler stuck in `gomp_team_barrier_wait_end`
    # while loading weights, after the launcher counted the draft's vocabulary with torch).
    # One thread runs torch's ops inline; the children get the launcher's count back.
    torch.set_num_threads(1)

    def set_start_method(method: str | None, force: bool = False) -> None:
        here = os.getpid() == launcher
        original("fork" if method == "spawn" and here else method, force=force)

    def spawn_in_children() -> None:
        if os.getpid() != launcher:
            original("spawn", force=True)
            torch.set_num_threads(threads)

    set_start_method._sglang_ssd = True  # type: ignore[attr-defined]
    multiprocessing.set_start_method = set_start_method
    os.register_at_fork(after_in_child=spawn_in_children)


def _with_environ(get: Callable[[str], dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
    """`spawn.get_preparation_data` that also carries the caller's environment."""

    def get_preparation_data(name: str) -> dict[str, Any]:
        data = get(name)
        data[ENVIRON_KEY] = dict(os.environ)
        return data

    return get_preparation_data


def _prepare_with_environ(prepare: Callable[[dict[str, Any]], None]) -> Callable[..., None]:
    """`spawn.prepare` that first sets the environment the parent sent, if it sent one."""

    def prepare_child(data: dict[str, Any]) -> None:
        environ = data.pop(ENVIRON_KEY, None)
        if environ is not None:
            os.environ.clear()
            os.environ.update(environ)
            if data.get("start_method") == "forkserver":
                # The child's own children (the DP controller's schedulers) are spawned, as
                # SGLang asked: they could not reach this forkserver or its preloads.
                data["start_method"] = "spawn"
        prepare(data)

    prepare_child._sglang_ssd = True  # type: ignore[attr-defined]
    return prepare_child


def _claim_process_title() -> None:
    """Let `setproctitle` find this process's argv memory now, before a child replaces its
    environment: setproctitle 1.3 looks for that memory next to the environment block on its
    first call and silently does nothing in a child whose environment was rebuilt, which
    would leave SGLang's children without their `sglang::scheduler` / `sglang::detokenizer`
    names (tests and `eval.load` find them by those)."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.getproctitle()


# In the forkserver (which imports this module first) and in every process that imports it:
# children forked or spawned from here apply the environment their parent sent.
if not getattr(spawn.prepare, "_sglang_ssd", False):
    _claim_process_title()
    spawn.prepare = _prepare_with_environ(spawn.prepare)

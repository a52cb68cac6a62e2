"""The zygote process itself: import once, then fork a child per request (`sglang_ssd.launch.zygote`
has the protocol, the client side and why).

`python -m sglang_ssd.launch.zygote_process --socket PATH` serves the servers' zygote (`serve`);
`fork_speculator_zygote` forks the launcher's speculator zygote in-process (`serve_on` on an
abstract socket). Each child sets itself up as an exec'd process would be (`_run_child`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import gc
import json
import os
import runpy
import selectors
import shlex
import signal
import socket
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ssd.launch.zygote import (
    LAUNCHER_MODULE,
    POLL_S,
    PR_SET_PDEATHSIG,
    PRELOAD,
    SPECULATOR_MODULE,
    SPECULATOR_PRELOAD,
    TITLE,
    read_line,
    socket_name,
)


def fork_speculator_zygote() -> tuple[int, str]:
    """Fork a speculator zygote (`SPECULATOR_PRELOAD`, `SPECULATOR_MODULE`) from this process,
    which must not have run torch on more than one thread yet (libgomp is not fork-safe once
    its pool exists: call this first thing). It listens on an abstract Unix socket (no file to
    clean up), bound here before the fork, so a request sent before its preload is done waits
    for it; it inherits this process's output and group and exits with it.

    Returns:
        (its pid, its address for `fork`: "@name", an abstract socket).
    """
    name = f"@sglang-ssd-speculators-{os.getpid()}-{os.urandom(4).hex()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_name(name))
    listener.listen(64)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            serve_on(listener, SPECULATOR_PRELOAD, SPECULATOR_MODULE)
        except SystemExit:
            pass
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    listener.close()
    return pid, name


def _run_child(request: Mapping[str, Any], module: str) -> int:
    """In the forked child: set up what the request describes and run `module` as
    `__main__`; its exit status."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if request["log"] is not None:
        os.setsid()
        fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.get("PYTHONUNBUFFERED"):  # read at interpreter start-up: the zygote's, not ours
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
    os.chdir(request["cwd"])
    if request["cpus"]:
        os.sched_setaffinity(0, request["cpus"])
    torch = sys.modules.get("torch")
    if torch is not None:  # it read OMP_NUM_THREADS when the zygote imported it
        threads = os.environ.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(threads) if threads.isdigit() else len(os.sched_getaffinity(0)))
    # The command line an exec would have shown, quoted so that `argv_of` gets it back.
    _set_title(shlex.join([sys.executable, "-m", module, *request["args"]]))
    if module == LAUNCHER_MODULE:
        from sglang_ssd.launch import fork_start

        fork_start.use_fork()
    sys.argv = [module, *request["args"]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def _set_title(title: str) -> None:
    """This process's title (`ps`, `/proc/PID/cmdline`), if setproctitle is installed."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


def _fork(
    request: Mapping[str, Any], listener: socket.socket, conn: socket.socket, module: str
) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        listener.close()
        conn.close()
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        code = _run_child(request, module)
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _status(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def serve(path: Path, preload: Sequence[str] = PRELOAD, module: str = LAUNCHER_MODULE) -> None:
    """Import `preload`, then fork a child per request on the Unix socket `path` that runs
    `module` as `__main__` with the request's args, until SIGTERM or until the parent process
    is gone."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            # Bound before the preload: a request sent meanwhile waits in the backlog.
            listener.bind(str(path))
            listener.listen(64)
            serve_on(listener, preload, module)
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def serve_on(listener: socket.socket, preload: Sequence[str], module: str) -> None:
    """`serve` on a bound, listening Unix socket."""
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    exited: dict[int, int] = {}
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    started = time.monotonic()
    for name in preload:
        __import__(name)
    # What the preload made is the children's read-mostly heap: out of the collector's sight, a
    # child's collections do not walk it (nor copy the pages they would have written to;
    # reference counts still write some).
    gc.freeze()
    _set_title(TITLE)
    print(f"zygote: preloaded in {time.monotonic() - started:.1f} s", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while os.getppid() == parent:
        for _key, _ in selector.select(POLL_S):
            conn, _ = listener.accept()
            with conn:
                _answer(conn, listener, exited, module)
        _reap(exited)


def _answer(
    conn: socket.socket, listener: socket.socket, exited: dict[int, int], module: str
) -> None:
    conn.settimeout(30)
    data = read_line(conn)
    if not data.endswith(b"\n"):
        return
    request = json.loads(data)
    try:
        if "poll" in request:
            _reap(exited)
            reply: dict[str, Any] = {"returncode": exited.get(int(request["poll"]))}
        else:
            runs = str(request.get("module") or module)
            pid = _fork(request, listener, conn, runs)
            print(f"zygote: pid {pid}: {runs} {' '.join(request['args'])}", flush=True)
            reply = {"pid": pid}
    except (OSError, KeyError, ValueError) as exc:
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    conn.sendall(json.dumps(reply).encode() + b"\n")


def _reap(exited: dict[int, int]) -> None:
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exited[pid] = _status(wait_status)


def _exit_with_parent(parent: int | None) -> bool:
    """Have the kernel send this process SIGTERM when its parent exits (Linux's
    PR_SET_PDEATHSIG); False when `parent` (the pid that started it, if known) is no longer
    its parent: it died before this ran (seen: a zygote started by a shell that exited at once
    stayed behind, orphaned, since `serve_on` then watched its new parent)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    return parent is None or os.getppid() == parent


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sglang_ssd.launch.zygote_process --socket PATH`; returns 0 after SIGTERM or
    the parent's exit."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang_ssd.launch.zygote_process", description=__doc__
    )
    parser.add_argument("--socket", type=Path, required=True, help="Unix socket path to serve")
    parser.add_argument(
        "--preload",
        default=",".join(PRELOAD),
        help="modules imported before any fork, comma-separated (default: the launcher's)",
    )
    parser.add_argument(
        "--module",
        default=LAUNCHER_MODULE,
        help="the module each request runs as __main__ with its args (%(default)s)",
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        help="the pid that starts it: it exits at once when that process is already gone",
    )
    args = parser.parse_args(argv)
    if not _exit_with_parent(args.parent_pid):
        return 0
    preload = tuple(m for m in args.preload.split(",") if m)
    with contextlib.suppress(SystemExit):
        serve(args.socket, preload, args.module)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

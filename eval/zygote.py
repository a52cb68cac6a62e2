"""A preloaded launcher that forks servers: start-ups without the import of SGLang each time.

On a 2-core CPU a tiny server's start-up is mostly imports: the launcher imports SGLang, torch
and transformers (~18 s of CPU), then its scheduler and detokenizer need the same modules again
(the forkserver of `sglang_ssd.fork_start` preloads them beside the launcher). A test session or
a benchmark that starts twenty servers pays that twenty times. The zygote pays it once:

- `python -m eval.zygote --socket PATH` imports the launcher and the modules SGLang's children
  run (`PRELOAD`), with `SGLANG_USE_CPU_ENGINE=1` set first (SGLang reads it at import time),
  then waits on a Unix socket.
- `Server` (eval/servers.py) asks it to start a launcher when `SGLANG_SSD_ZYGOTE` names that
  socket (`ADDRESS_ENV`). The zygote forks; the child becomes a session leader, writes to the
  server's log, takes the caller's whole environment, working directory and CPU affinity,
  sets torch's thread count from `OMP_NUM_THREADS` (torch read it at import), and runs
  `python -m sglang_ssd.launch_server ARGS` in-process. SGLang's scheduler and detokenizer are
  then forked from that child (`fork_start.use_fork`): they find everything imported.
- The child's pid comes back to the caller; the zygote reaps its children and answers polls
  for their exit status, so `ZygoteChild` stands in for `subprocess.Popen`.

What the server then runs is the same code as after an exec; only what was imported before
the fork differs (module-level state computed at import sees the zygote's environment: CPU
only, `SGLANG_USE_CPU_ENGINE=1`). Measured start-up seconds of exec'd launchers come from
`python -m eval.startup`, which never uses the zygote. The tests use it (tests/conftest.py
starts one per session); `SGLANG_SSD_ZYGOTE=0` in the environment turns that off.

The zygote exits when its parent does, and on SIGTERM.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ADDRESS_ENV = "SGLANG_SSD_ZYGOTE"
LAUNCHER_MODULE = "sglang_ssd.launch_server"
# `sglang_ssd.fork_start` first: importing it claims setproctitle's memory while the
# environment is the zygote's own (a child replaces its environment, after which setproctitle
# would silently do nothing and SGLang's children would lose their `sglang::*` names).
PRELOAD = (
    "sglang_ssd.fork_start",
    LAUNCHER_MODULE,
    "sglang.launch_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
    "sglang_ssd.integration.registration",
    "sglang_ssd.integration.hooks",
)
READY = b"ready\n"
POLL_S = 0.5


class ZygoteError(RuntimeError):
    """The zygote could not be reached, or refused a start."""


def address() -> str | None:
    """The socket path of the zygote servers should be forked from, or None (unset or "0")."""
    value = os.environ.get(ADDRESS_ENV, "")
    return None if value in ("", "0") else value


def _read_line(s: socket.socket) -> bytes:
    """Bytes up to and including the first newline, or all there were if the peer closed
    first (one JSON message per line: the protocol here)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


# ------------------------------------------------------------------------------ client side
def _ask(path: str, request: Mapping[str, Any], timeout_s: float = 600.0) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(path)
            s.sendall(json.dumps(request).encode() + b"\n")
            reply = _read_line(s)
        except OSError as exc:
            raise ZygoteError(f"zygote at {path}: {exc}") from exc
    if not reply:
        raise ZygoteError(f"zygote at {path} closed the connection without a reply")
    answer = json.loads(reply)
    if "error" in answer:
        raise ZygoteError(f"zygote at {path}: {answer['error']}")
    return answer


class ZygoteChild:
    """A launcher forked by the zygote, with the part of `subprocess.Popen`'s interface that
    `Server` uses: `pid`, `returncode`, `poll`, `wait`, `send_signal`, `kill`."""

    def __init__(self, path: str, pid: int) -> None:
        self.path = path
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status (negative: killed by that signal) once the zygote reaped the
        process, else None. Raises `ZygoteError` when the zygote cannot be reached."""
        if self.returncode is None:
            self.returncode = _ask(self.path, {"poll": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status. Raises `subprocess.TimeoutExpired` after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(LAUNCHER_MODULE, timeout or 0.0)
            time.sleep(0.1)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_launcher(
    path: str,
    args: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    cpus: Sequence[int] | None = None,
) -> ZygoteChild:
    """Have the zygote at `path` start `python -m sglang_ssd.launch_server ARGS` with `env`
    (the whole environment), stdout and stderr appended to `log_path`, pinned to `cpus`.

    Raises:
        ZygoteError: when the zygote cannot be reached or fails to fork.
    """
    request = {
        "args": list(args),
        "env": dict(env),
        "cwd": os.getcwd(),
        "log": str(log_path),
        "cpus": sorted(set(cpus)) if cpus else None,
    }
    return ZygoteChild(path, int(_ask(path, request)["pid"]))


@contextlib.contextmanager
def running(
    path: Path,
    log_path: Path,
    preload: Sequence[str] = PRELOAD,
    module: str = LAUNCHER_MODULE,
    timeout_s: float = 300.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a zygote on socket `path` (its output to `log_path`; `serve` has `preload` and
    `module`) without waiting for its preload, yield its process; terminate it on exit. A
    request sent before the preload is done waits for it (the socket is bound first).

    Raises:
        ZygoteError: when the zygote exits before it binds the socket.
    """
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "eval.zygote", "--socket", str(path)),
                *("--preload", ",".join(preload), "--module", module),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise ZygoteError(f"zygote did not bind {path}: see {log_path}")
        time.sleep(0.05)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------ zygote side
def _run_child(request: Mapping[str, Any], module: str) -> int:
    """In the forked child: set up what the request describes and run `module` as
    `__main__`; its exit status."""
    os.setsid()
    fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["cpus"]:
        os.sched_setaffinity(0, request["cpus"])
    torch = sys.modules.get("torch")
    if torch is not None:  # it read OMP_NUM_THREADS when the zygote imported it
        threads = os.environ.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(threads) if threads.isdigit() else len(os.sched_getaffinity(0)))
    from sglang_ssd import fork_start

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
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    exited: dict[int, int] = {}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        # Bound before the preload: a request sent meanwhile waits in the backlog.
        listener.bind(str(path))
        listener.listen(64)
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        started = time.monotonic()
        for name in preload:
            __import__(name)
        print(f"zygote: preloaded in {time.monotonic() - started:.1f} s", flush=True)
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        try:
            while os.getppid() == parent:
                for _key, _ in selector.select(POLL_S):
                    conn, _ = listener.accept()
                    with conn:
                        _answer(conn, listener, exited, module)
                _reap(exited)
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _answer(
    conn: socket.socket, listener: socket.socket, exited: dict[int, int], module: str
) -> None:
    conn.settimeout(30)
    data = _read_line(conn)
    if not data.endswith(b"\n"):
        return
    request = json.loads(data)
    try:
        if "poll" in request:
            _reap(exited)
            reply: dict[str, Any] = {"returncode": exited.get(int(request["poll"]))}
        else:
            pid = _fork(request, listener, conn, module)
            print(f"zygote: pid {pid}: {module} {' '.join(request['args'])}", flush=True)
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


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m eval.zygote --socket PATH`; returns 0 after SIGTERM or the parent's exit."""
    parser = argparse.ArgumentParser(prog="python -m eval.zygote", description=__doc__)
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
    args = parser.parse_args(argv)
    preload = tuple(m for m in args.preload.split(",") if m)
    with contextlib.suppress(SystemExit):
        serve(args.socket, preload, args.module)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

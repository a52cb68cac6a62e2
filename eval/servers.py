"""Start and stop real `python -m sglang_ssd.launch_server` processes for the eval harness.

A `Server` owns one server: a free port, optional CPU pinning (`os.sched_setaffinity` in the
child before exec, plus `OMP_NUM_THREADS` and `SGLANG_CPU_OMP_THREADS_BIND`, which SGLang's CPU
engine uses to re-bind its OpenMP threads), a log file, a readiness wait on `/health_generate`,
and a stop that ends the whole process group (SIGINT to the launcher, SIGKILL for anything
left after a grace period) and checks the port is free again.

Why the process group: SGLang's launcher forks a scheduler, a detokenizer and a multiprocessing
resource tracker; killing only the launcher can leave them (and the port) behind.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil
import requests

from sglang_ssd.launch import zygote
from sglang_ssd.launch.cpu_lists import format_cpu_list

LAUNCHER = ("-m", zygote.LAUNCHER_MODULE)
HEALTH_PATHS = ("/health_generate", "/health")
# Seconds between looks for the server's port and readiness probes during start-up (a tiny
# server is ready ~5 s after its fork on the AMX Xeon: at 1 s, a look lost ~0.5 s a start).
READY_POLL_S = 0.25
# uvicorn's message when the HTTP port was taken; the server then waits forever to shut down.
BIND_ERROR = b"error while attempting to bind on address"
PORT_ATTEMPTS = 3
# A start that failed (never served) is killed after this grace: SGLang, after uvicorn's bind
# error, waits in "application shutdown" for as long as it is let.
FAILED_START_GRACE_S = 3.0
# How `terminate` asks a server to exit: Ctrl-C's signal. Under SIGTERM SGLang's tokenizer manager
# drains first and notices the signal only at its next 5 s poll (`sigterm_watchdog`,
# sglang/srt/managers/tokenizer_manager.py:3508-3510): a stop took 5.0 s against 0.4 s under
# SIGINT, where uvicorn stops at once and SGLang kills its process tree. The servers here are
# stopped when idle, so there is nothing to drain; tests/integration/test_ssd_shutdown.py checks
# that both signals stop every process and free every port.
STOP_SIGNAL = signal.SIGINT
# Called with each server once it answers (`Server.start`): e.g. the test session records every
# start-up's seconds for CI's cost report (tests/conftest.py, scripts/ci_times.py). A listener
# that raises fails the start: the server is stopped and the error goes to the caller.
START_LISTENERS: list[Callable[[Server], None]] = []


def _log_has(path: Path, start: int, needle: bytes) -> bool:
    """Whether `needle` occurs in the file `path` from byte offset `start` on."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return needle in f.read()
    except OSError:
        return False


class ServerError(RuntimeError):
    """A server failed to start, died, or could not be stopped cleanly."""


class PortInUse(ServerError):
    """Another process bound the server's port first."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nothing listens on `port` (a bind succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def cpu_list(cpus: Sequence[int]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0,1,2,5"`` (the form taskset and SGLang accept)."""
    return ",".join(str(c) for c in sorted(set(cpus)))


def pinning_env(cpus: Sequence[int] | None, threads: int | None) -> dict[str, str]:
    """Environment overrides that go with pinning a server to `cpus`."""
    env: dict[str, str] = {}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if cpus:
        env.setdefault("OMP_NUM_THREADS", str(len(set(cpus))))
        # SGLang's CPU engine binds its OpenMP threads to this list (or to a whole NUMA node
        # when it is unset, which would undo the pinning).
        env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_list(cpus)
    return env


def _set_affinity(cpus: Sequence[int] | None) -> Callable[[], None] | None:
    if not cpus:
        return None
    cpu_set = set(cpus)

    def preexec() -> None:
        os.sched_setaffinity(0, cpu_set)

    return preexec


def _group_pids(pgid: int) -> list[int]:
    """Live (not zombie) pids whose process group is `pgid`."""
    pids = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
        except (OSError, psutil.Error):  # gone meanwhile
            continue
    return sorted(pids)


def _descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:  # the process is gone
        return []


def _family(pgid: int) -> set[int]:
    """The live processes of a server started as group leader `pgid`: its group and every
    descendant (a child may have left the group)."""
    return set(_group_pids(pgid)) | set(_descendants(pgid))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _affinity_of(pid: int) -> str | None:
    try:
        return format_cpu_list(psutil.Process(pid).cpu_affinity() or ())
    except psutil.Error:
        return None


def _comm_of(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


@dataclass
class Server:
    """One launcher process. Use as a context manager, or call `start()` / `stop()`.

    Args:
        name: label used in logs and results.
        args: launcher arguments (SGLang's flags and `--ssd-*`), without host and port.
        cpus: pin the whole server (every process it forks) to these CPUs.
        threads: `OMP_NUM_THREADS` (defaults to ``len(cpus)`` when pinned).
        env: further environment overrides.
        log_path: where stdout and stderr go (a temp-like default under the cwd otherwise).
        python: interpreter that runs the launcher.
        startup_timeout: seconds to wait for readiness.
        zygote_socket: socket of a preloaded zygote to fork the launcher from
            (`sglang_ssd/launch/zygote.py`; default: the one `SGLANG_SSD_ZYGOTE` names, if
            any); None execs it, as always when `python` is not this interpreter.
    """

    name: str
    args: Sequence[str]
    cpus: Sequence[int] | None = None
    threads: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    python: str = sys.executable
    host: str = "127.0.0.1"
    port: int | None = None
    startup_timeout: float = 900.0
    stop_grace: float = 15.0
    zygote_socket: str | None = field(default_factory=zygote.address)

    proc: subprocess.Popen[bytes] | zygote.ZygoteChild | None = field(
        default=None, init=False, repr=False
    )
    info: dict[str, Any] = field(default_factory=dict, init=False)
    _terminated_at: float | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env_overrides(self) -> dict[str, str]:
        """Every environment variable this server gets on top of the caller's environment."""
        return {**pinning_env(self.cpus, self.threads), **dict(self.env)}

    def argv(self) -> list[str]:
        return [self.python, *LAUNCHER, *self.args, "--host", self.host, "--port", str(self.port)]

    def command_line(self) -> str:
        """A shell command equivalent to what `start` runs (taskset stands for the affinity)."""
        parts = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env_overrides().items())]
        if self.cpus:
            parts += ["taskset", "-c", cpu_list(self.cpus)]
        return " ".join([*parts, *(shlex.quote(a) for a in self.argv())])

    def start(self) -> Server:
        """Launch and wait until the server answers; raises `ServerError` with the log tail.

        When the port was picked here (`port` None) and something else bound it between the
        pick and the server's bind (SGLang draws its internal ports at random too), the server
        is stopped and started again on another port, up to `PORT_ATTEMPTS` times.
        """
        if self.proc is not None:
            raise ServerError(f"{self.name}: already started")
        picked = self.port is None
        for attempt in range(PORT_ATTEMPTS):
            try:
                return self._start_once()
            except PortInUse:
                if not picked or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.proc, self.port = None, None
        raise AssertionError("unreachable")

    def _start_once(self) -> Server:
        if self.port is None:
            self.port = free_port(self.host)
        if self.log_path is None:
            self.log_path = Path(f"eval-server-{self.name}-{self.port}.log")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env_overrides()}
        started = time.time()
        with open(self.log_path, "ab") as log:
            log.write(f"# {self.command_line()}\n".encode())
            log.flush()
            log_start = log.tell()
            forked_from = self._zygote()
            if forked_from is None:
                self.proc = subprocess.Popen(
                    self.argv(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_set_affinity(self.cpus),
                )
        if forked_from is not None:
            args = self.argv()[1 + len(LAUNCHER) :]
            self.proc = zygote.fork(forked_from, args, env, self.log_path, self.cpus)
        self.info = {
            "name": self.name,
            "argv": self.argv(),
            "command_line": self.command_line(),
            "env_overrides": self.env_overrides(),
            "cpus": sorted(set(self.cpus)) if self.cpus else None,
            "port": self.port,
            "pid": self.proc.pid,
            "log_path": str(self.log_path),
            "started_at": started,
            "zygote": forked_from,
        }
        try:
            self._wait_ready(started, log_start)
        except BaseException:
            self.stop(check_port=False, grace_s=FAILED_START_GRACE_S)
            raise
        self.info["startup_s"] = time.time() - started
        self.info["processes"] = self.processes()
        try:
            for listener in START_LISTENERS:
                listener(self)
        except BaseException:  # a listener refused it (the test session's marker check)
            self.stop(check_port=False, grace_s=FAILED_START_GRACE_S)
            raise
        return self

    def _zygote(self) -> str | None:
        """The zygote socket to fork this server's launcher from, or None to exec it."""
        return self.zygote_socket if self.python == sys.executable else None

    def _wait_ready(self, started: float, log_start: int = 0) -> None:
        assert self.proc is not None and self.log_path is not None
        deadline = started + self.startup_timeout
        while time.time() < deadline:
            if _log_has(self.log_path, log_start, BIND_ERROR):
                raise PortInUse(
                    f"{self.name}: port {self.port} was taken before the server bound it"
                )
            if self.proc.poll() is not None:
                raise ServerError(
                    f"{self.name}: exited with status {self.proc.returncode} during startup\n"
                    + self.log_tail()
                )
            if not self._listening():
                time.sleep(READY_POLL_S)  # not bound yet, or someone else's port: no probe
                continue
            for path in HEALTH_PATHS:
                try:
                    r = requests.get(self.url + path, timeout=30)
                except requests.RequestException:
                    break  # not listening yet
                if r.status_code == 200:
                    return
                if r.status_code != 404:
                    break
            time.sleep(READY_POLL_S)
        raise ServerError(
            f"{self.name}: not ready after {self.startup_timeout:.0f} s\n" + self.log_tail()
        )

    def _listening(self) -> bool:
        """Whether one of the server's own processes listens on its port. Until then no
        readiness probe is sent: when another program took the port first (SGLang draws its
        internal ports at random), a probe would wait on that program for its whole timeout
        instead of the next look at the log for the bind error."""
        assert self.proc is not None
        for pid in _family(self.proc.pid):
            with contextlib.suppress(psutil.Error):
                for conn in psutil.Process(pid).net_connections(kind="tcp"):
                    if conn.status == psutil.CONN_LISTEN and conn.laddr.port == self.port:
                        return True
        return False

    def processes(self) -> list[dict[str, Any]]:
        """The server's live processes with their observed CPU affinity."""
        if self.proc is None:
            return []
        pids = sorted(_family(self.proc.pid))
        return [{"pid": p, "comm": _comm_of(p), "cpus": _affinity_of(p)} for p in pids]

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        # SGLang logs all server args on one line; keep the tail readable.
        return "\n".join(line[:300] for line in text[-lines:])

    def terminate(self) -> None:
        """Ask the server to exit without waiting: `STOP_SIGNAL` to the launcher, which kills
        its children (SGLang's Ctrl-C path), or to the whole group if the launcher is already
        gone. `stop` waits, escalates to SIGKILL and checks."""
        if self.proc is None or self._terminated_at is not None:
            return
        self._terminated_at = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(STOP_SIGNAL)
        else:
            _signal_group(self.proc.pid, STOP_SIGNAL)

    def stop(self, check_port: bool = True, grace_s: float | None = None) -> None:
        """`terminate`, SIGKILL the group and every descendant left after `grace_s` s (default
        `stop_grace`), reap, and (if `check_port`) raise `ServerError` unless the port is free
        and nothing is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        seen = {p["pid"] for p in self.info.get("processes", [])}
        pids = seen | _family(pgid) | {pgid}
        if self._terminated_at is None:
            self.terminate()
        grace = self.stop_grace if grace_s is None else grace_s
        deadline = (self._terminated_at or time.time()) + grace
        while time.time() < deadline and any(_alive(p) for p in pids):
            self._reap()
            time.sleep(0.2)
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=max(0.0, deadline - time.time()))
        survivors = [p for p in pids | set(_group_pids(pgid)) if _alive(p)]
        if survivors:
            _signal_group(pgid, signal.SIGKILL)
            for p in survivors:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        self._reap(block=True)
        self.info["stopped_at"] = time.time()
        self.info["stop_s"] = self.info["stopped_at"] - (self._terminated_at or time.time())
        self.info["killed_after_grace"] = bool(survivors)
        leftover = [p for p in pids if _alive(p)]
        port = self.port
        self.proc = None
        self._terminated_at = None
        if check_port:
            deadline = time.time() + 10
            while port is not None and not port_is_free(port, self.host):
                if time.time() > deadline:
                    raise ServerError(f"{self.name}: port {port} still in use after stop")
                time.sleep(0.2)
            if leftover:
                raise ServerError(f"{self.name}: processes left after stop: {leftover}")

    def _reap(self, block: bool = False) -> None:
        if self.proc is None:
            return
        if block:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        else:
            self.proc.poll()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(check_port=exc_type is None)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@contextlib.contextmanager
def started_together(made: Mapping[str, Server]) -> Iterator[Mapping[str, Server]]:
    """`made`'s servers started side by side (their start-ups overlap); on exit all are asked to
    stop at once, then each is stopped and checked.

    Raises:
        ServerError: if any fails to start (the others are stopped too).
    """
    with contextlib.ExitStack() as stack:
        for server in made.values():
            stack.push(server)
        # Runs first on exit: every server shuts down at once instead of one after the other.
        stack.callback(lambda: [s.terminate() for s in made.values()])
        with ThreadPoolExecutor(max_workers=max(1, len(made))) as pool:
            futures = [pool.submit(s.start) for s in made.values()]
        for future in futures:
            future.result()
        yield made

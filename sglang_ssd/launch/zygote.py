"""A preloaded process that forks children: start-ups without importing SGLang, torch and
transformers each time (CPU only: CUDA state must never be forked).

On a 2-core CPU a tiny server's start-up is mostly imports: the launcher imports SGLang, torch
and transformers (~18 s of CPU), its scheduler and detokenizer need the same modules again (the
forkserver of `sglang_ssd.launch.fork_start` preloads them beside the launcher), and the speculator
imports torch and transformers once more (~9 s). A zygote imports once and forks:

- `python -m sglang_ssd.launch.zygote_process --socket PATH [--preload M,...] [--module M]`
  (`zygote_process`: the zygote itself; this module is the client side) imports the `--preload`
  modules with `SGLANG_USE_CPU_ENGINE=1` set first (SGLang reads it at import time), then
  waits on a Unix socket. For each request it forks a child that takes the caller's whole
  environment and working directory, is pinned to the request's CPUs (else
  keeps the zygote's affinity, not the caller's) and, if asked, becomes a session leader
  writing to a log file; it sets torch's thread count from `OMP_NUM_THREADS`
  (torch read it when the zygote imported it), sets its process title to the command line an
  exec would have shown, and runs `python -m MODULE ARGS` in-process (MODULE: the request's,
  else the zygote's `--module`).
- The child's pid comes back to the caller; the zygote reaps its children and answers polls
  for their exit status, so `ZygoteChild` stands in for `subprocess.Popen`.

Two zygotes use this:
- **Servers** (`LAUNCHER_MODULE`, `PRELOAD`): `eval.servers.Server` forks its launcher from
  the zygote `SGLANG_SSD_ZYGOTE` names (`ADDRESS_ENV`); tests/conftest.py starts one per test
  session. SGLang's scheduler and detokenizer are then forked from the launcher
  (`fork_start.use_fork`). `python -m eval.startup` times exec'd launchers against it. Tests
  that run a launcher (or another module that imports SGLang) to its end, such as a start it
  must refuse, run it from the same zygote (`run`, through
  `sglang_ssd.testing.processes.run_module`).
- **Speculators** (`SPECULATOR_MODULE`, `SPECULATOR_PRELOAD`): on CPU the SSD launcher forks
  one at its start (`zygote_process.fork_speculator_zygote`, from `launch_server`), so the
  speculator's imports run beside the target's
  start-up instead of after it; the SSD worker forks each speculator (and each restart) from
  it (`SPECULATOR_ADDRESS_ENV`, set for SGLang's children; `SGLANG_SSD_SPECULATOR_FORK=0`
  turns it off and execs `python -m sglang_ssd.speculator` as before).

What a child runs is the same code as after an exec; only what was imported before the fork
differs (module-level state computed at import sees the zygote's environment). A zygote exits
when its parent does, and on SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ADDRESS_ENV = "SGLANG_SSD_ZYGOTE"
LAUNCHER_MODULE = "sglang_ssd.launch_server"
# `sglang_ssd.launch.fork_start` first: importing it claims setproctitle's memory while the
# environment is the zygote's own (a child replaces its environment, after which setproctitle
# would silently do nothing and SGLang's children would lose their `sglang::*` names).
PRELOAD = (
    "sglang_ssd.launch.fork_start",
    LAUNCHER_MODULE,
    "sglang.launch_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.models.registry",  # imports every model module (`fork_start.PRELOAD`)
    "sglang_ssd.integration.registration",
    "sglang_ssd.integration.hooks",
)
SPECULATOR_MODULE = "sglang_ssd.speculator"
SPECULATOR_PRELOAD = (
    "sglang_ssd.launch.fork_start",
    "sglang_ssd.speculator.__main__",
    "sglang_ssd.speculator.int8_model",
)
SPECULATOR_ADDRESS_ENV = "SGLANG_SSD_SPECULATOR_ZYGOTE"
SPECULATOR_SWITCH = "SGLANG_SSD_SPECULATOR_FORK"
TITLE = "sglang_ssd::zygote"
POLL_S = 0.5
PR_SET_PDEATHSIG = 1  # prctl(2)


class ZygoteError(RuntimeError):
    """The zygote could not be reached, or refused a start."""


def address(name: str = ADDRESS_ENV) -> str | None:
    """The socket path the environment variable `name` gives (default: the servers' zygote),
    or None (unset or "0")."""
    value = os.environ.get(name, "")
    return None if value in ("", "0") else value


def socket_name(address: str) -> str:
    """The `socket` address of `address`: "@name" is the abstract socket "\\0name"."""
    return "\0" + address[1:] if address.startswith("@") else address


def read_line(s: socket.socket) -> bytes:
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
            s.connect(socket_name(path))
            s.sendall(json.dumps(request).encode() + b"\n")
            reply = read_line(s)
        except OSError as exc:
            raise ZygoteError(f"zygote at {path}: {exc}") from exc
    if not reply:
        raise ZygoteError(f"zygote at {path} closed the connection without a reply")
    answer = json.loads(reply)
    if "error" in answer:
        raise ZygoteError(f"zygote at {path}: {answer['error']}")
    return answer


class ZygoteChild:
    """A process forked by a zygote, with the part of `subprocess.Popen`'s interface that
    `eval.servers.Server` and the speculator's supervisor use: `pid`, `returncode`, `poll`,
    `wait`, `send_signal`, `terminate`, `kill`."""

    def __init__(self, path: str, pid: int) -> None:
        self.path = path
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status (negative: killed by that signal) once the zygote reaped the
        process, else None; asks the zygote only once the process no longer runs (a running
        one is seen in /proc). Raises `ZygoteError` when the zygote cannot be reached."""
        if self.returncode is None and not _running(self.pid):
            self.returncode = _ask(self.path, {"poll": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status. Raises `subprocess.TimeoutExpired` after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"zygote child {self.pid}", timeout or 0.0)
            time.sleep(0.1)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def argv_of(pid: int) -> list[str]:
    """Process `pid`'s command line: its argv, or for a child forked from a zygote (one string,
    the title `shlex.join` made of the argv an exec would have had) that argv. Empty if the
    process is gone.

    Note: a title longer than the memory setproctitle finds (the zygote's own argv and
    environment) is cut short; a speculator's (~1 kB) fits any ordinary environment.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    fields = raw.rstrip(b"\0").split(b"\0")
    if len(fields) > 1:
        return [f.decode(errors="replace") for f in fields]
    try:
        return shlex.split(fields[0].decode(errors="replace").rstrip(" "))
    except ValueError:  # a cut-short title
        return fields[0].decode(errors="replace").split()


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (its state in /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"


def fork(
    path: str,
    args: Sequence[str],
    env: Mapping[str, str],
    log_path: Path | None = None,
    cpus: Sequence[int] | None = None,
    module: str | None = None,
) -> ZygoteChild:
    """Have the zygote at `path` start `python -m MODULE ARGS` (`module`, default the
    zygote's own) with `env` (the whole environment) and the caller's working directory, pinned
    to `cpus`. With `log_path` the child leads a session of its own and appends stdout and
    stderr there (a server); without, it stays in the zygote's process group and writes where
    the zygote does (a speculator, in its server's group and log).

    Raises:
        ZygoteError: when the zygote cannot be reached or fails to fork.
    """
    request = {
        "args": list(args),
        "env": dict(env),
        "cwd": os.getcwd(),
        "log": None if log_path is None else str(log_path),
        "cpus": sorted(set(cpus)) if cpus else None,
        **({} if module is None else {"module": module}),
    }
    return ZygoteChild(path, int(_ask(path, request)["pid"]))


def run(
    path: str, module: str, args: Sequence[str], env: Mapping[str, str], timeout_s: float
) -> tuple[int, str]:
    """`python -m module args` as a child of the zygote at `path`, to its end: (exit status,
    its stdout and stderr interleaved, line by line when `env` sets PYTHONUNBUFFERED, as
    `testing.processes.run_module` does). What `subprocess.run` with `stderr=STDOUT` gives for
    an exec'd run, without the imports the zygote already did.

    Raises:
        ZygoteError: when the zygote cannot be reached or fails to fork.
        subprocess.TimeoutExpired: after `timeout_s` s, with the output so far (the child's
            session is killed first, as on any exception while waiting).
    """
    with tempfile.TemporaryDirectory(prefix="zygote-run-") as folder:
        log = Path(folder) / "output.log"
        child = fork(path, args, env, log, module=module)

        def output() -> str:
            return log.read_text(errors="replace") if log.exists() else ""

        try:
            code = child.wait(timeout_s)
        except BaseException as exc:  # a timeout, Ctrl-C, ...: the child does not outlive us
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            if isinstance(exc, subprocess.TimeoutExpired):
                command = f"{module} {shlex.join(args)}"
                raise subprocess.TimeoutExpired(command, timeout_s, output()) from exc
            raise
        return code, output()


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
                *(sys.executable, "-m", "sglang_ssd.launch.zygote_process", "--socket", str(path)),
                *("--preload", ",".join(preload), "--module", module),
                *("--parent-pid", str(os.getpid())),
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

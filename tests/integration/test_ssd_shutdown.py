"""Shutdown: a signal to the launcher stops every process and frees every port.

Three SSD servers on the tiny pair. The first two are the session's keyed servers "api" and "admin"
(`keyed_servers.py`: the auth module checked its routes on them; a key changes nothing here, and a
start-up costs ~30 s of CI); the third starts right after one of them stopped, on its HTTP port (so
a restart right after a stop is checked too). Each serves a request, then gets SIGTERM, SIGINT, or
SIGINT to its whole process group (Ctrl-C in a terminal). Then the launcher, the scheduler, the
detokenizer and the speculator must all be gone (no orphan anywhere on the machine still runs this
link's speculator), and the HTTP port and the link's ports (the ZMQ control socket and the TCPStore
of the tensor group) must be free.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from keyed_servers import KeyedPool, KeyedServer
from tiny_servers import ssd_args

from eval.servers import Server, free_port, port_is_free
from sglang_ssd.testing.processes import speculators

STOP_WAIT_S = 30.0
KEYED = {signal.SIGTERM: "api", signal.SIGINT: "admin"}  # the keyed server each signal stops
_freed: list[int] = []  # HTTP ports of the servers stopped so far: the Ctrl-C server reuses one


def _speculator_link(launcher: int) -> tuple[psutil.Process, dict[str, Any]]:
    """The speculator process and the `LinkAddress` it was started with."""
    found = speculators(launcher)
    assert found, f"no speculator under the launcher {launcher}"
    return found[0].process, json.loads(found[0].arg("--address"))


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _processes_of_session(session: str) -> list[int]:
    """Processes anywhere on the machine started for this link (e.g. an orphaned speculator)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if session in " ".join(proc.info["cmdline"] or ()):
            found.append(proc.info["pid"])
    return found


def _ctrl_c_server(pair: tuple[Path, Path], logs: Path, port: int) -> KeyedServer:
    """A tiny SSD server without keys on `port`, started."""
    args = ssd_args(*pair, ["--skip-server-warmup"])
    server = Server("shutdown-ctrl-c", args, port=port, log_path=logs / "ctrl-c.log")
    return KeyedServer("none", server.start())


@pytest.mark.parametrize(
    ("how", "sig"),
    [("launcher", signal.SIGTERM), ("launcher", signal.SIGINT), ("group", signal.SIGINT)],
    ids=["sigterm", "sigint", "ctrl-c"],
)
def test_signal_stops_everything_and_frees_the_ports(
    how: str,
    sig: signal.Signals,
    keyed_pool: KeyedPool,
    tiny_pair: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    if how == "launcher":
        keyed = keyed_pool.take(KEYED[sig])
    else:
        # In file order, right after the SIGTERM and SIGINT servers stopped: on one's port.
        port = _freed[-1] if _freed else free_port()
        assert port_is_free(port), "the previous server did not free the port"
        keyed = _ctrl_c_server(tiny_pair, tmp_path, port)
    server = keyed.server
    try:
        assert server.proc is not None
        launcher = server.proc.pid
        children = psutil.Process(launcher).children(recursive=True)
        names = {p.name() for p in children}
        assert {"sglang::scheduler", "sglang::detokenizer"} <= names, names
        speculator, link = _speculator_link(launcher)
        keyed.generate(16, prompt="hello")

        if how == "group":
            os.killpg(launcher, sig)
        else:
            os.kill(launcher, sig)
        pids = [launcher, *(p.pid for p in children)]
        deadline = time.monotonic() + STOP_WAIT_S
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            server.proc.poll()  # reap the launcher (our child) once it exits
            time.sleep(0.2)
        left = {pid: psutil.Process(pid).name() for pid in pids if _running(pid)}
        assert not left, f"still running {STOP_WAIT_S} s after {sig.name}: {left}"
        assert _processes_of_session(link["session"]) == [], "an orphaned speculator"
        assert not _running(speculator.pid)

        control_port = int(link["control"].rsplit(":", 1)[1])
        ports = {"http": server.port, "control": control_port, "tensor store": link["store_port"]}
        busy = [name for name, port in ports.items() if not port_is_free(port)]
        assert not busy, f"ports still in use: {busy} of {ports}"
        _freed.append(server.port)
        speculator_errors = [
            line
            for line in server.log_path.read_text(errors="replace").splitlines()
            if "sglang_ssd/speculator" in line and line.lstrip().startswith("File")
        ]
        assert not speculator_errors, speculator_errors  # no traceback through the speculator
    finally:
        server.stop(check_port=False)

"""Tiny servers a module starts for itself: an AR and an SSD server on one target, an SSD server
beside the session's shared AR, a router in front of servers (test helper)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import requests
from tiny_servers import TINY_FLAGS, ssd_args

from eval.servers import Server, ServerError, free_port, started_together


@contextlib.contextmanager
def ar_and_ssd(
    target: Path, draft: Path, logs: Path, ssd_flags: Sequence[str] = ()
) -> Iterator[dict[str, Server]]:
    """{"ar": ..., "ssd": ...} servers of `target` (fp32), SSD drafting with `draft` plus
    `ssd_flags`; the two start-ups overlap; both are stopped on exit. For a target other than
    the tiny pair's (whose AR server the session shares: `beside_shared_ar`).

    Raises:
        eval.servers.ServerError: if either fails to start (the other is stopped too).
    """
    ar = ["--model-path", str(target), *TINY_FLAGS, "--speculative-algorithm", "NONE"]
    made = {
        "ar": Server("ar", ar, log_path=logs / "ar.log"),
        "ssd": Server("ssd", ssd_args(target, draft, ssd_flags), log_path=logs / "ssd.log"),
    }
    with started_together(made):
        yield made


@contextlib.contextmanager
def beside_shared_ar(
    ar: Server, target: Path, draft: Path, logs: Path, ssd_flags: Sequence[str] = ()
) -> Iterator[dict[str, Server]]:
    """{"ar": `ar` (the session's shared tiny AR server), "ssd": an SSD server of its own}: the
    SSD server of `target` drafting with `draft` plus `ssd_flags`, stopped on exit.

    Raises:
        eval.servers.ServerError: if the SSD server fails to start.
    """
    with Server("ssd", ssd_args(target, draft, ssd_flags), log_path=logs / "ssd.log") as ssd:
        yield {"ar": ar, "ssd": ssd}


def ssd_stats(server: Server) -> dict:
    """`GET /ssd/stats` of `server` (raises on an HTTP error)."""
    response = requests.get(f"{server.url}/ssd/stats", timeout=60)
    response.raise_for_status()
    return response.json()


@contextlib.contextmanager
def router(
    worker_urls: Sequence[str], log_path: Path, policy: str = "round_robin", timeout_s: float = 60
) -> Iterator[str]:
    """`python -m sglang_router.launch_router` in front of `worker_urls` with `policy`; yields
    its URL once `/readiness` answers 200 (every worker healthy); stopped (its process group)
    on exit.

    Raises:
        eval.servers.ServerError: when it exits or is not ready within `timeout_s` (its log's
            tail in the message).
    """
    port = free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--policy", policy, "--worker-urls", *worker_urls]
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not _ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise ServerError(f"router not ready (exit status {proc.poll()}):\n{tail}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/readiness", timeout=2).status_code == 200
    except requests.RequestException:
        return False

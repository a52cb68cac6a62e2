"""Servers started side by side: any set of them, or an AR and an SSD server on one target
(test helper)."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import requests

from eval.servers import Server, ServerError, free_port

TINY_FLAGS = ("--max-total-tokens", "4096", "--dtype", "float32")


@contextlib.contextmanager
def ar_and_ssd(
    target: Path, draft: Path, logs: Path, ssd_flags: Sequence[str] = ()
) -> Iterator[dict[str, Server]]:
    """{"ar": ..., "ssd": ...} servers of `target` (fp32, 4096 KV tokens), SSD drafting with
    `draft` plus `ssd_flags`; the two start-ups overlap; both are stopped on exit.

    Raises:
        eval.servers.ServerError: if either fails to start (the other is stopped too).
    """
    common = ["--model-path", str(target), *TINY_FLAGS]
    spec = ["--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(draft)]
    made = {
        "ar": Server("ar", [*common, "--speculative-algorithm", "NONE"], log_path=logs / "ar.log"),
        "ssd": Server("ssd", [*common, *spec, *ssd_flags], log_path=logs / "ssd.log"),
    }
    with started(made):
        yield made


def ssd_stats(server: Server) -> dict:
    """`GET /ssd/stats` of `server` (raises on an HTTP error)."""
    response = requests.get(f"{server.url}/ssd/stats", timeout=60)
    response.raise_for_status()
    return response.json()


@contextlib.contextmanager
def started(made: Mapping[str, Server]) -> Iterator[Mapping[str, Server]]:
    """`made`'s servers started side by side (their start-ups overlap), all stopped on exit.

    Raises:
        eval.servers.ServerError: if any fails to start (the others are stopped too).
    """
    with contextlib.ExitStack() as stack:
        for server in made.values():
            stack.callback(server.stop)
        with cf.ThreadPoolExecutor(len(made)) as pool:
            list(pool.map(Server.start, made.values()))
        yield made


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

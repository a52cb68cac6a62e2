"""Speculator faults under live traffic: SIGKILL, and SIGSTOP for a hang.

One SSD server and one autoregressive server on the tiny random pair. Each test streams several
concurrent greedy requests through SSD, signals the speculator once they are under way, and checks
that every request completes with exactly the AR server's tokens, that no stream stalls much
beyond `--ssd-speculator-timeout`, that the fault is logged and counted in `/ssd/stats`, that
the target served the gap with its own n-gram drafts, that a new speculator process replaced the
old one (which is gone, not an orphan), and that SSD resumes: requests sent after the restart are
served from the speculation cache again.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from pair_servers import beside_shared_ar

from eval.servers import Server

TIMEOUT_S = 5.0  # --ssd-speculator-timeout
MAX_NEW_TOKENS = 300
AFTER_NEW_TOKENS = 100
SIGNAL_AFTER_TOKENS = 30  # signal once the first stream has this many tokens
STALL_SLACK_S = 10.0  # a loaded 2-core machine adds scheduling noise to the timeout
RESTART_WAIT_S = 180.0
PROMPTS = ["hello world", "def f(x): return", "abcabcabcabc", "the quick brown fox"]
AFTER_PROMPTS = ["zzz", "1 2 3 4", "print(", "SELECT * FROM"]


@pytest.fixture(scope="module")
def servers(
    tiny_target: Path,
    tiny_draft: Path,
    tiny_servers: dict[str, Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Server]]:
    """The session's shared tiny AR server and an SSD server of this module's own (its
    speculator is killed and stopped here)."""
    logs = tmp_path_factory.mktemp("fault-logs")
    timeout = ["--ssd-speculator-timeout", str(TIMEOUT_S)]
    with beside_shared_ar(tiny_servers["ar"], tiny_target, tiny_draft, logs, timeout) as made:
        yield made


def _body(prompt: str, stream: bool = False, n: int = MAX_NEW_TOKENS) -> dict[str, Any]:
    sampling = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
    return {"text": prompt, "sampling_params": sampling, "stream": stream}


def _generate(server: Server, prompt: str, n: int = MAX_NEW_TOKENS) -> list[int]:
    response = requests.post(f"{server.url}/generate", json=_body(prompt, n=n), timeout=300)
    response.raise_for_status()
    return response.json()["output_ids"]


def _concurrently(server: Server, prompts: list[str], n: int) -> list[list[int]]:
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: _generate(server, p, n), prompts))


_AR_OUTPUTS: dict[tuple[str, int], list[list[int]]] = {}


def _autoregressive(ar: Server, prompts: list[str], n: int) -> list[list[int]]:
    """The AR server's greedy outputs (the same for every test: computed once)."""
    key = ("\n".join(prompts), n)
    if key not in _AR_OUTPUTS:
        _AR_OUTPUTS[key] = _concurrently(ar, prompts, n)
    return _AR_OUTPUTS[key]


def _stream(server: Server, prompt: str, progress: dict[str, int]) -> tuple[list[int], float]:
    """A streamed greedy request: (its output ids, the longest gap between two chunks)."""
    output: list[int] = []
    last, longest = time.monotonic(), 0.0
    with requests.post(
        f"{server.url}/generate", json=_body(prompt, stream=True), stream=True, timeout=300
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            text = line.decode()
            if not text.startswith("data:") or text == "data: [DONE]":
                continue
            now = time.monotonic()
            longest, last = max(longest, now - last), now
            output = json.loads(text[len("data:") :])["output_ids"]  # cumulative
            progress[prompt] = len(output)
    return output, longest


def _stats(server: Server) -> dict[str, Any]:
    response = requests.get(f"{server.url}/ssd/stats", timeout=120)
    response.raise_for_status()
    return response.json()


def _wait_for_restart(server: Server, old_pid: int, restarts: float) -> dict[str, Any]:
    deadline = time.monotonic() + RESTART_WAIT_S
    while time.monotonic() < deadline:
        stats = _stats(server)
        pid = stats["speculator"].get("speculator_pid")
        if stats["restarts"] > restarts and stats["speculator_up"] and pid not in (None, old_pid):
            return stats
        time.sleep(1.0)
    raise AssertionError(f"no restart within {RESTART_WAIT_S} s:\n{server.log_tail()}")


def _gone(pid: int) -> bool:
    """True if `pid` no longer exists (a zombie would still be an unreaped leftover)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return True


def _fault_under_load(servers: dict[str, Server], sig: signal.Signals, resume: bool) -> None:
    ar, ssd = servers["ar"], servers["ssd"]
    expected = _autoregressive(ar, PROMPTS, MAX_NEW_TOKENS)
    before = _stats(ssd)
    old_pid = int(before["speculator"]["speculator_pid"])
    local_before = before["rounds_by_source"].get("local-ngram", 0)

    progress: dict[str, int] = {}
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = [pool.submit(_stream, ssd, p, progress) for p in PROMPTS]
        deadline = time.monotonic() + 120
        while max(progress.values(), default=0) < SIGNAL_AFTER_TOKENS:
            assert time.monotonic() < deadline, "the streams never started"
            assert not any(f.done() and f.exception() for f in futures)
            time.sleep(0.005)
        os.kill(old_pid, sig)
        signalled_at = progress.copy()
        if resume:  # a hang that ends by itself, after the target gave up on it
            threading.Timer(2 * TIMEOUT_S, _resume, args=(old_pid,)).start()
        results = [f.result() for f in futures]

    got = [output for output, _ in results]
    assert got == expected, "outputs differ from the autoregressive server's"
    assert min(signalled_at.values(), default=0) < MAX_NEW_TOKENS, "the fault came too late"
    longest_gap = max(gap for _, gap in results)
    assert longest_gap < TIMEOUT_S + STALL_SLACK_S, f"a stream stalled for {longest_gap:.1f} s"

    after = _wait_for_restart(ssd, old_pid, before["restarts"])
    assert after["faults"] >= before["faults"] + 1
    assert after["rounds_by_source"].get("local-ngram", 0) > local_before
    assert "SSD: speculator fault" in ssd.log_path.read_text(errors="replace")
    assert _gone(old_pid), f"the old speculator {old_pid} is still there"

    # SSD resumes: requests sent after the restart are served from the speculation cache again.
    cache_before = after["rounds_by_source"].get("cache", 0)
    expected = _autoregressive(ar, AFTER_PROMPTS, AFTER_NEW_TOKENS)
    assert _concurrently(ssd, AFTER_PROMPTS, AFTER_NEW_TOKENS) == expected
    resumed = _stats(ssd)
    assert resumed["rounds_by_source"].get("cache", 0) > cache_before
    assert resumed["speculator"].get("cache_hits", 0) > 0  # counted by the new process
    assert resumed["faults"] == after["faults"], "a healthy speculator was faulted"


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def test_sigkill_mid_requests_is_survived_and_ssd_resumes(servers: dict[str, Server]) -> None:
    _fault_under_load(servers, signal.SIGKILL, resume=False)


@pytest.mark.parametrize("resume", [False, True], ids=["stopped-for-good", "continued-later"])
def test_sigstop_hang_times_out_and_ssd_resumes(servers: dict[str, Server], resume: bool) -> None:
    _fault_under_load(servers, signal.SIGSTOP, resume=resume)

"""Sustained load against an SSD server: errors, leaks and memory growth.

`run_load` keeps N streaming clients busy for a fixed time (mixed greedy and sampled requests of
mixed lengths; every few requests a client hangs up mid-stream, which aborts the request), while
sampling the resident memory of the server's scheduler and speculator processes. `leak_counters`
reads what must return to its idle value once the load is over: the speculator's KV slots
(committed and branch), its open requests and speculation-cache entries, and the target client's
per-request bookkeeping. `settle` sends one short request first, because requests that left the
batch without a finish notice are swept one decode round later.

`python -m eval.load` runs it for 3 minutes against the real pair (an SSD server with the
launcher's defaults) and writes `eval/results/load-3min.json`; the CI version on the tiny pair is
`tests/integration/test_ssd_load.py`.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import requests

from eval.cpuload import CpuSample, cpu_delta, wait_for_load
from eval.provenance import git_info, machine_info
from eval.sampling import Sampling
from eval.servers import Server

RESULTS = Path(__file__).resolve().parent / "results"
LEAK_KEYS = (
    "kv_slots_used",
    "open_requests",
    "cache_entries",
    "target_opened",
    "target_pending",
    "target_tracked",
)
RSS_GROWTH_LIMIT = 0.10


@dataclass
class LoadShape:
    """What the clients send: prompts as token ids, token budgets, how often to sample/abort."""

    prompts: Sequence[Sequence[int]]
    max_new_tokens: tuple[int, int] = (8, 64)
    sampled_fraction: float = 0.25  # the rest is greedy
    abort_every: int = 7  # a client's every n-th request hangs up after a few chunks
    seed: int = 0


@dataclass
class ClientTally:
    """One client's counts; `errors` holds a description of each failed request."""

    requests: int = 0
    completed: int = 0
    aborted: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)


def server_processes(launcher_pid: int) -> dict[str, psutil.Process]:
    """The scheduler and speculator processes under `launcher_pid`, by role."""
    found: dict[str, psutil.Process] = {}
    for proc in psutil.Process(launcher_pid).children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
            name = proc.name()
        except psutil.Error:
            continue
        if "sglang_ssd.speculator" in cmdline:
            found["speculator"] = proc
        elif "scheduler" in name or "scheduler" in cmdline:
            found["scheduler"] = proc
    return found


def rss_bytes(launcher_pid: int) -> dict[str, int]:
    """Resident memory of the scheduler and the (current) speculator, and their sum."""
    out = {}
    for role, proc in server_processes(launcher_pid).items():
        try:
            out[role] = proc.memory_info().rss
        except psutil.Error:
            continue
    out["total"] = sum(out.values())
    return out


def ssd_stats(url: str) -> dict[str, Any]:
    response = requests.get(f"{url}/ssd/stats", timeout=120)
    response.raise_for_status()
    return response.json()


def leak_counters(stats: dict[str, Any]) -> dict[str, float | None]:
    """From `/ssd/stats`, the counters that must return to their idle value after the load."""
    return {key: stats["speculator"].get(key) for key in LEAK_KEYS}


def settle(url: str, prompt: Sequence[int]) -> None:
    """One short greedy request: its decode rounds sweep requests that left unannounced."""
    sampling = Sampling(max_new_tokens=8, ignore_eos=True)
    body = {"input_ids": list(prompt), "sampling_params": sampling.to_sglang()}
    requests.post(f"{url}/generate", json=body, timeout=600).raise_for_status()


def _one_request(
    session: requests.Session, url: str, body: dict[str, Any], abort_after: int | None
) -> tuple[str, int]:
    """Stream one request; returns ("completed" | "aborted", tokens received)."""
    tokens = 0
    with session.post(f"{url}/generate", json=body, stream=True, timeout=600) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        chunks, last = 0, None
        for line in response.iter_lines():
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            last = json.loads(line[len(b"data:") :])
            if "error" in last:
                raise RuntimeError(f"stream error: {last['error']}")
            chunks += 1
            tokens = len(last.get("output_ids", ()))
            if abort_after is not None and chunks >= abort_after:
                return "aborted", tokens  # closing the connection aborts the request
        if last is None:
            raise RuntimeError("empty stream")
        wanted = body["sampling_params"]["max_new_tokens"]
        if tokens != wanted:
            raise RuntimeError(f"{tokens} tokens, expected {wanted} (ignore_eos)")
    return "completed", tokens


def _client(url: str, shape: LoadShape, index: int, deadline: float, tally: ClientTally) -> None:
    rng = random.Random(shape.seed * 1000 + index)
    session = requests.Session()
    while time.monotonic() < deadline:
        tally.requests += 1
        sampling = Sampling(max_new_tokens=rng.randint(*shape.max_new_tokens), ignore_eos=True)
        if rng.random() < shape.sampled_fraction:
            sampling = replace(sampling, temperature=0.7, top_p=0.95, seed=rng.randrange(2**31))
        body = {
            "input_ids": list(rng.choice(shape.prompts)),
            "sampling_params": sampling.to_sglang(),
            "stream": True,
        }
        abort_after = rng.randint(1, 4) if tally.requests % shape.abort_every == 0 else None
        try:
            outcome, tokens = _one_request(session, url, body, abort_after)
        except Exception as exc:  # counted, and the client goes on
            tally.errors.append(f"{type(exc).__name__}: {exc}"[:500])
            continue
        tally.tokens += tokens
        if outcome == "aborted":
            tally.aborted += 1
        else:
            tally.completed += 1


def run_load(
    url: str,
    launcher_pid: int,
    shape: LoadShape,
    clients: int = 16,
    duration_s: float = 30.0,
    warmup_s: float = 10.0,
    sample_every_s: float = 1.0,
) -> dict[str, Any]:
    """Run `clients` streaming clients for `duration_s` (the first `warmup_s` of it are the
    warm-up); returns counts, throughput and RSS.

    RSS growth compares the last sample under load with the first sample after the warm-up;
    the peak after the warm-up is reported too. The warm-up matters: the speculator's RSS
    rises for a while as oneDNN caches a kernel per new input shape (bf16 on CPU; the cache is
    bounded) and the allocator settles, then levels off.
    """
    start = time.monotonic()
    deadline = start + duration_s
    tallies = [ClientTally() for _ in range(clients)]
    threads = [
        threading.Thread(target=_client, args=(url, shape, i, deadline, tally), daemon=True)
        for i, tally in enumerate(tallies)
    ]
    pids = [p.pid for p in server_processes(launcher_pid).values()]
    cpu_before = CpuSample.take(pids)
    for thread in threads:
        thread.start()
    samples: list[tuple[float, dict[str, int]]] = []
    while any(t.is_alive() for t in threads):
        samples.append((time.monotonic() - start, rss_bytes(launcher_pid)))
        time.sleep(sample_every_s)
    elapsed = time.monotonic() - start
    cpu = cpu_delta(cpu_before, CpuSample.take(pids))
    after_warmup = [rss for t, rss in samples if warmup_s <= t <= duration_s] or [samples[-1][1]]
    warm, last = after_warmup[0], after_warmup[-1]
    tokens = sum(t.tokens for t in tallies)
    return {
        "clients": clients,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "elapsed_s": elapsed,
        "requests": sum(t.requests for t in tallies),
        "completed": sum(t.completed for t in tallies),
        "aborted": sum(t.aborted for t in tallies),
        "errors": [e for t in tallies for e in t.errors],
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "rss_warm_bytes": warm,
        "rss_last_bytes": last,
        "rss_peak_bytes": max(s["total"] for s in after_warmup),
        "rss_growth": (last["total"] - warm["total"]) / warm["total"],
        "rss_samples": [{"t": round(t, 1), **rss} for t, rss in samples],
        "cpu": cpu,
    }


def check(result: dict[str, Any]) -> list[str]:
    """Why a load result fails the load bar (empty when it passes)."""
    problems = []
    if result["errors"]:
        problems.append(f"{len(result['errors'])} errors, e.g. {result['errors'][0]}")
    if result["completed"] == 0:
        problems.append("no request completed")
    leaks = {
        k: (result["counters_before"][k], v)
        for k, v in result["counters_after"].items()
        if v != result["counters_before"][k]
    }
    if leaks:
        problems.append(f"leaked (before, after): {leaks}")
    if result["rss_growth"] >= RSS_GROWTH_LIMIT:
        problems.append(f"RSS grew {100 * result['rss_growth']:.1f}% after warm-up")
    if result["faults_after"] != result["faults_before"]:
        problems.append("speculator faults during the load")
    return problems


def measure(
    server: Server, shape: LoadShape, clients: int, duration_s: float, warmup_s: float
) -> dict[str, Any]:
    """Idle counters, the load (see `run_load`), then the counters again after `settle`."""
    assert server.proc is not None
    settle(server.url, shape.prompts[0])
    before = ssd_stats(server.url)
    result = run_load(server.url, server.proc.pid, shape, clients, duration_s, warmup_s)
    settle(server.url, shape.prompts[0])
    after = ssd_stats(server.url)
    result.update(
        counters_before=leak_counters(before),
        counters_after=leak_counters(after),
        faults_before=before.get("faults"),
        faults_after=after.get("faults"),
        restarts=after.get("restarts"),
        cache_hit_rate=after.get("cache_hit_rate"),
        accept_length=after.get("accept_length"),
    )
    result["problems"] = check(result)
    return result


def _real_prompts(n: int) -> list[list[int]]:
    from eval.configs import default_model_dirs
    from eval.datasets import HUMANEVAL, MTBENCH, load_prompts, load_tokenizer

    tokenizer = load_tokenizer(default_model_dirs()[0])
    prompts = load_prompts(HUMANEVAL, tokenizer, n) + load_prompts(MTBENCH, tokenizer, n)
    return [list(p.input_ids) for p in prompts]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.load", description=__doc__)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    parser.add_argument("--warmup", type=float, default=60.0, help="its first seconds: warm-up")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8, help="per dataset (HumanEval, MT-Bench)")
    parser.add_argument("--out", type=Path, default=RESULTS / "load-3min.json")
    parser.add_argument("--max-load", type=float, default=3.0, help="start below this loadavg")
    parser.add_argument("--min-free-gb", type=float, default=9.0, help="and this much memory")
    parser.add_argument("--max-wait", type=float, default=2700.0, help="seconds to wait for it")
    parser.add_argument("server_args", nargs="*", help="extra launcher flags (after --)")
    args = parser.parse_args(argv)

    prompts = _real_prompts(args.prompts)
    quiet = wait_for_load(args.max_load, args.max_wait, min_free_gb=args.min_free_gb)
    print("starting after", json.dumps(quiet), flush=True)
    log = RESULTS / "logs" / f"{args.out.stem}.log"
    started = time.time()
    with Server("ssd-load", args.server_args, log_path=log) as server:
        result = measure(server, LoadShape(prompts), args.clients, args.duration, args.warmup)
        result["processes"] = server.info.get("processes")
        result["command_line"] = server.command_line()
    result.update(started_at=started, load_wait=quiet, machine=machine_info(), git=git_info())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    summary = {k: result[k] for k in ("requests", "completed", "aborted", "tokens", "tokens_per_s")}
    print(json.dumps(summary), f"errors={len(result['errors'])}")
    print(f"RSS growth after warm-up: {100 * result['rss_growth']:.2f}%")
    print("counters before/after:", result["counters_before"], result["counters_after"])
    print("problems:", result["problems"] or "none")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

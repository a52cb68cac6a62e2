"""A speculator KV pool far too small for the load, on real tiny-pair servers.

An SSD server whose speculator holds only `POOL` KV tokens (`--ssd-draft-kv-tokens`) serves 8
concurrent greedy requests that need several times that, with jit drafts for every cache miss.
The requests whose prefill, jit draft or branches do not fit draft by n-gram (or miss the cache)
for those rounds, the others as usual: every output equals the autoregressive server's,
the speculator never faults or restarts, `/ssd/stats` counts the exhaustion, and once the
requests are done the speculator holds no request and no KV slot.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from pathlib import Path

import pytest
import requests
from pair_servers import beside_shared_ar, ssd_stats

from eval.servers import Server

POOL = 200
PROMPTS = [
    "def compute_total(items, limit):~    ",
    "def merge_node(left, right):~    if left > 3:~",
    "def parse_token(batch):~    for index in range(",
    "Each draft token",
    "class Buffer:~    def __init__(self, size):~        self.",
    "def scale(values, factor):~    return [",
    "for row in table:~    if row.total > limit:~        ",
    "def first_match(pattern, lines):~    for line in lines:~",
]
NEW_TOKENS = 48
SETTLE_S = 60.0  # hang guard for the speculator to drop finished requests, not a speed claim


@pytest.fixture(scope="module")
def servers(
    tiny_target: Path,
    tiny_draft: Path,
    tiny_servers: dict[str, Server],
    tmp_path_factory: pytest.TempPathFactory,
):
    # jit for every miss (auto would pick n-gram at this batch size): jit drafts need slots too
    flags = ["--ssd-draft-kv-tokens", str(POOL), "--ssd-backup", "jit"]
    logs = tmp_path_factory.mktemp("pool-logs")
    with beside_shared_ar(tiny_servers["ar"], tiny_target, tiny_draft, logs, flags) as made:
        yield made


def _greedy(server: Server, prompt: str) -> list[int]:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0}}
    response = requests.post(f"{server.url}/generate", json=body, timeout=600)
    response.raise_for_status()
    return response.json()["output_ids"]


def test_a_full_speculator_pool_degrades_requests_without_faults(servers):
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        expected = list(pool.map(lambda p: _greedy(servers["ar"], p), PROMPTS))
        got = list(pool.map(lambda p: _greedy(servers["ssd"], p), PROMPTS))
    assert got == expected
    stats = ssd_stats(servers["ssd"])
    speculator = stats["speculator"]
    assert stats["faults"] == 0 and stats["restarts"] == 0, stats
    assert speculator["kv_slots_total"] == POOL and speculator["draft_kv_tokens"] == POOL
    assert speculator["kv_exhausted"] > 0, speculator
    by_source = stats["rounds_by_source"]
    assert by_source.get("ngram", 0) > 0, by_source  # the requests that did not fit
    assert by_source.get("jit", 0) + by_source.get("cache", 0) > 0, by_source  # the others
    deadline = time.monotonic() + SETTLE_S
    while _holding(stats):  # nothing left behind by the finished requests, on either side
        assert time.monotonic() < deadline, stats
        time.sleep(0.5)
        stats = ssd_stats(servers["ssd"])


def _holding(stats: dict) -> list[str]:
    """The request and KV-slot counts of `/ssd/stats` that are not back to zero."""
    speculator = stats["speculator"]
    counts = {
        "target_running": stats["target_running"],
        "target_tracked": speculator["target_tracked"],
        "open_requests": speculator["open_requests"],
        "kv_slots_used": speculator["kv_slots_used"],
    }
    return [name for name, count in counts.items() if count]

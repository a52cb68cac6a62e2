"""SGLang's own EAGLE3 (`--speculative-algorithm EAGLE3`) served on CPU through this plugin, with
a head our trainer built for the tiny target: greedy output equals the AR
server's, and the head's drafts are accepted (accept length > 1).

SGLang's CPU speculative path verifies greedily, so its T > 0 output is not lossless; only
greedy is checked here (the benchmarks mark EAGLE3's T > 0 rows "greedy verify on CPU").
"""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest
import requests
from pair_servers import TINY_FLAGS

from eval.servers import Server

pytestmark = pytest.mark.integration
PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "class Stack:"]
EAGLE3_FLAGS = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1")


@pytest.fixture(scope="module")
def servers(
    tiny_target: Path,
    tiny_eagle3_head,
    tiny_servers: dict[str, Server],
    tmp_path_factory: pytest.TempPathFactory,
):
    """The session's shared tiny AR server and an EAGLE3 server of this module's own."""
    head, _ = tiny_eagle3_head
    logs = tmp_path_factory.mktemp("eagle3-logs")
    common = ["--model-path", str(tiny_target), *TINY_FLAGS]
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(head)]
    args = [*common, *spec, *EAGLE3_FLAGS, "--speculative-num-draft-tokens", "4"]
    with Server("eagle3", args, log_path=logs / "eagle3.log") as eagle3:
        yield {"ar": tiny_servers["ar"], "eagle3": eagle3}


def _greedy(server: Server) -> list[dict]:
    def one(prompt: str) -> dict:
        body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 24}}
        response = requests.post(f"{server.url}/generate", json=body, timeout=300)
        response.raise_for_status()
        return response.json()

    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


def test_eagle3_greedy_equals_ar_and_drafts_are_accepted(servers) -> None:
    got, want = _greedy(servers["eagle3"]), _greedy(servers["ar"])
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    lengths = [g["meta_info"]["spec_accept_length"] for g in got]
    assert sum(lengths) / len(lengths) > 1.1, lengths

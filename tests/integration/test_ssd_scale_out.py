"""SSD scaled out on the tiny pair: a `--dp-size 2` server and a single-replica server (the
session's shared tiny SSD server), both started with `python -m sglang_ssd.launch_server`,
behind `sglang_router.launch_router --policy round_robin`.

Twenty mixed greedy requests (different prompts and lengths, sent concurrently) through the
router must each equal the tiny target's greedy output through transformers in fp32 (which
SGLang's CPU greedy equals on this pair: fp32 noise is far below its top-2 margins), and every
replica must have served some: the single server and both replicas of the DP server
(`/ssd/stats`, which on a DP server lists each replica). Each DP replica runs its own
speculator process, named after it. The DP server shares the 2 cores between its replicas
(`--ssd-allow-shared-cores`, for tests).
"""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest
import requests
from pair_servers import router, ssd_stats
from tiny_servers import ssd_args

from eval.servers import Server
from sglang_ssd.testing.greedy import transformers_greedy
from sglang_ssd.testing.processes import speculators
from sglang_ssd.testing.tiny_models import tokenize

pytestmark = pytest.mark.integration

WORDS = ["def", "total", "merge", "value", "index", "return", "items", "left", "count", "node"]
# 20 distinct prompts, 4 to 16 new tokens each.
REQUESTS = [(f"{WORDS[i % 10]}_{WORDS[(3 * i + 1) % 10]}(", 4 + (i * 5) % 13) for i in range(20)]


@pytest.fixture(scope="module")
def servers(
    tiny_target: Path,
    tiny_draft: Path,
    tiny_servers: dict[str, Server],
    tmp_path_factory: pytest.TempPathFactory,
):
    logs = tmp_path_factory.mktemp("scale-out")
    args = [*ssd_args(tiny_target, tiny_draft), "--dp-size", "2", "--ssd-allow-shared-cores"]
    made = {"dp": Server("dp", args, log_path=logs / "dp.log"), "one": tiny_servers["ssd"]}
    with made["dp"], router([s.url for s in made.values()], logs / "router.log") as url:
        yield {**made, "router": url}


def _generate(url: str, ids: list[int], n: int) -> list[int]:
    sampling = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
    response = requests.post(
        f"{url}/generate", json={"input_ids": ids, "sampling_params": sampling}, timeout=300
    )
    response.raise_for_status()
    return response.json()["output_ids"]


def test_router_over_dp_and_single_servers_is_lossless(servers, tiny_target: Path) -> None:
    prompts = [tokenize(text) for text, _ in REQUESTS]
    lengths = [n for _, n in REQUESTS]
    single_rounds = ssd_stats(servers["one"])["rounds"]  # the shared server has served before
    with cf.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(_generate, [servers["router"]] * 20, prompts, lengths))
    expected = transformers_greedy(tiny_target, prompts, lengths)
    wrong = [(i, e, g) for i, (e, g) in enumerate(zip(expected, got, strict=True)) if e != g]
    assert not wrong, wrong

    single = ssd_stats(servers["one"])
    assert "replicas" not in single and single["rounds"] > single_rounds, single
    listed = ssd_stats(servers["dp"])
    assert listed["dp_size"] == 2, listed
    replicas = listed["replicas"]
    assert [r["dp_rank"] for r in replicas] == [0, 1]  # as each replica reports itself
    assert all(r["rounds"] > 0 and r["speculator_up"] for r in replicas), replicas
    # round robin over 2 workers, then over 2 replicas: 10 + 5 + 5 requests (their rounds
    # differ with the lengths, so only that each served is checked).
    config = requests.get(f"{servers['dp'].url}/ssd/config", timeout=60).json()
    assert [r["dp_rank"] for r in config["replicas"]] == [0, 1]


def test_each_dp_replica_has_its_own_speculator(servers) -> None:
    ranks = [int(found.arg("--dp-rank")) for found in speculators(servers["dp"].proc.pid)]
    assert sorted(ranks) == [0, 1], ranks

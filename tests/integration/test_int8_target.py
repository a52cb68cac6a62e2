"""`--quantization ssd_int8` served end to end on the tiny pair: every mode runs on the int8
target, and greedy output is lossless relative to it.

A copy of the tiny target is served (the int8 cache is written beside the checkpoint). The
autoregressive int8 server starts first and quantises; the SSD server then starts from the
cache. Greedy SSD, in its async and sync modes, must reproduce the int8 AR server token
for token (paper §3: speculation is exact relative to the target it verifies with, here the
int8 one); so must SGLang's STANDALONE (marked `real`: a third server start). The tiny target
ties its LM head to the embeddings, so its 8 projections (qkv, o, gate_up, down × 2 layers) are
what is quantised; the real pair's LM head is covered by `real_int8/test_int8.py`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import requests
from tiny_servers import TINY_FLAGS

from eval.servers import Server, started_together
from sglang_ssd.target import METHOD
from sglang_ssd.target.int8_cache import FOLDER

pytestmark = pytest.mark.integration

PROMPTS = ["hello world", "def f(x): return", "abcabcabcabc", "the quick brown fox"]
PROJECTIONS = 8  # 2 layers × (qkv, o, gate_up, down)
INT8 = ("--quantization", METHOD)


@pytest.fixture(scope="module")
def int8_target(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny target (its int8 cache goes beside it, not beside the shared one)."""
    return Path(shutil.copytree(tiny_target, tmp_path_factory.mktemp("int8") / "target"))


@pytest.fixture(scope="module")
def servers(
    int8_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mapping[str, Server]]:
    """ "ar" (started first: it quantises), then "ssd" (it reads the cache)."""
    logs = tmp_path_factory.mktemp("int8-logs")
    common = ["--model-path", str(int8_target), *TINY_FLAGS, *INT8]
    ar = [*common, "--speculative-algorithm", "NONE", "--disable-overlap-schedule"]
    ssd = [*common, "--speculative-algorithm", "SSD", "--speculative-draft-model-path"]
    made = {
        "ar": Server("int8-ar", ar, log_path=logs / "ar.log"),
        "ssd": Server("int8-ssd", [*ssd, str(tiny_draft)], log_path=logs / "ssd.log"),
    }
    with started_together({"ar": made["ar"]}), started_together({"ssd": made["ssd"]}):
        yield made


@pytest.fixture(scope="module")
def standalone(
    servers: Mapping[str, Server], int8_target: Path, tiny_draft: Path, tmp_path_factory
) -> Iterator[Server]:
    """SGLang's STANDALONE on the int8 target (its draft left unquantised: SGLang would
    otherwise quantise the shared tiny draft too and cache it beside that folder)."""
    args = [
        *("--model-path", str(int8_target), *TINY_FLAGS, *INT8, "--attention-backend", "intel_amx"),
        *(
            "--speculative-algorithm",
            "STANDALONE",
            "--speculative-draft-model-path",
            str(tiny_draft),
        ),
        *("--speculative-num-steps", "4", "--speculative-eagle-topk", "1"),
        *(
            "--speculative-num-draft-tokens",
            "5",
            "--speculative-draft-model-quantization",
            "unquant",
        ),
    ]
    logs = tmp_path_factory.mktemp("int8-standalone")
    with Server("int8-standalone", args, log_path=logs / "standalone.log") as server:
        yield server


def _greedy(server: Server, prompt: str, n: int) -> dict:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}}
    response = requests.post(f"{server.url}/generate", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


def _same_greedy_output(reference: Server, server: Server) -> None:
    for i, prompt in enumerate(PROMPTS):
        n = 12 + 6 * i
        expected = _greedy(reference, prompt, n)["output_ids"]
        got = _greedy(server, prompt, n)
        assert got["output_ids"] == expected, (server.name, prompt)
        assert got["meta_info"]["spec_verify_ct"] > 0, server.name


def test_the_first_start_quantises_and_caches_the_next_one_reads_the_cache(servers, int8_target):
    ar_log = servers["ar"].log_path.read_text(errors="replace")
    assert "quantising layers" in ar_log and f"{PROJECTIONS} layers cached" in ar_log
    ssd_log = servers["ssd"].log_path.read_text(errors="replace")
    assert "loading cached layers" in ssd_log and "quantising layers" not in ssd_log
    assert len(list((int8_target / FOLDER).iterdir())) == 1


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_greedy_ssd_and_sync_equal_the_int8_autoregressive_server(servers, mode):
    """SSD's asynchronous rounds, then synchronous SD's (`--ssd-mode sync`), switched live on
    the one SSD server."""
    url = servers["ssd"].url
    assert requests.post(f"{url}/ssd/config", json={"mode": mode}, timeout=60).ok
    _same_greedy_output(servers["ar"], servers["ssd"])


@pytest.mark.real
def test_greedy_standalone_equals_the_int8_autoregressive_server(servers, standalone):
    _same_greedy_output(servers["ar"], standalone)

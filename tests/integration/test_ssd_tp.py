"""SSD with a tensor-parallel target (`--tp-size 2`) served end to end on CPU: one speculator
for the TP group, driven by rank 0, and greedy output equal to the autoregressive server's
(the session's shared tiny AR server, `--tp-size 1`) under docs/design.md#the-greedy-rule rule: the
two TP
layouts sum in another order (float32 noise, ~1e-6), so a divergence would be allowed only
where the target's fp32 top-2 margin is below ε (`check_greedy`).

SGLang's CPU engine runs `--tp-size 2` on 2 cores with `SGLANG_CPU_OMP_THREADS_BIND="0|1"`
(one core per rank); the speculator shares rank 1's core, which costs speed, not correctness.
"""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest
import requests
from tiny_servers import ssd_args

from eval.servers import Server
from sglang_ssd.testing import check_greedy
from sglang_ssd.testing.processes import speculators
from sglang_ssd.testing.tiny_models import tokenize

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "class Stack:"]
pytestmark = pytest.mark.integration
TP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def servers(
    tiny_target: Path,
    tiny_draft: Path,
    tiny_servers: dict[str, Server],
    tmp_path_factory: pytest.TempPathFactory,
):
    """The session's shared tiny AR server and a `--tp-size 2` SSD server of this module's."""
    log = tmp_path_factory.mktemp("tp-logs") / "ssd.log"
    args = [*ssd_args(tiny_target, tiny_draft), "--tp-size", "2"]
    with Server("ssd-tp2", args, env=TP_ENV, log_path=log) as ssd:
        yield {"ar": tiny_servers["ar"], "ssd": ssd}


def _generate(server: Server, prompt: str, max_new_tokens: int, **sampling) -> dict:
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, **sampling},
    }
    response = requests.post(f"{server.url}/generate", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


def _outputs(server: Server, **sampling) -> list[list[int]]:
    """Every prompt sent at once (one batch), greedy unless `sampling` says otherwise."""
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        done = pool.map(lambda p: _generate(server, p, 24, temperature=0, **sampling), PROMPTS)
        return [out["output_ids"] for out in done]


def test_tp2_greedy_equals_ar(servers, tiny_target: Path):
    prompts = [tokenize(p) for p in PROMPTS]
    check = check_greedy(tiny_target, prompts, _outputs(servers["ar"]), _outputs(servers["ssd"]))
    assert not check.violations, check.violations
    stats = requests.get(f"{servers['ssd'].url}/ssd/stats", timeout=30).json()
    # It really speculated across the TP group: drafts were accepted, some from the cache.
    assert stats["rounds"] > 0 and stats["accept_length"] > 1.0
    assert stats["rounds_by_source"].get("cache", 0) > 0


def test_tp2_sampling_runs_to_max_tokens(servers):
    # T > 0: rank 0 verifies with its uniforms and broadcasts the outcome; rank 1 commits it.
    out = _generate(servers["ssd"], "hello", 20, temperature=0.8, ignore_eos=True)
    assert out["meta_info"]["completion_tokens"] == 20


def test_one_speculator_for_the_tp_group_under_rank_0(servers):
    found = speculators(servers["ssd"].proc.pid)
    assert len(found) == 1
    assert "TP0" in found[0].target.name()

"""An EAGLE-3 head as SSD's speculator, served by a real SGLang server on the tiny target.

`--speculative-algorithm SSD --speculative-draft-model-path HEAD --disable-radix-cache`: the
target captures the head's feature layers and ships the committed positions' features with
each Step; the speculator drafts with the head over its KV pool. The head is the one CI trains
for the tiny target (`tiny_eagle3_head`).
Greedy output must equal the autoregressive server's, the head's drafts must be accepted
(accept length > 1.2), and a repeated prompt (which the radix cache would
have served without features) must be drafted by the head again.
"""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest
import requests
from tiny_servers import ssd_args

from eval.servers import Server
from sglang_ssd.testing.corpus import tiny_corpus

pytestmark = pytest.mark.integration

NEW_TOKENS = 48
HEAD_SOURCES = ("cache", "jit")  # drafts the head made (pre-speculated, or just in time)


def _prompts() -> list[str]:
    text = tiny_corpus(num_chars=3000, seed=901)  # the head trained on seeds 100..111
    return [text[i : i + 160] for i in (0, 700, 1400, 2100)]


@pytest.fixture(scope="module")
def servers(
    tiny_target: Path,
    tiny_eagle3_head,
    tiny_servers: dict[str, Server],
    tmp_path_factory: pytest.TempPathFactory,
):
    """The session's shared tiny AR server and an SSD server drafting with the head."""
    head, _ = tiny_eagle3_head
    logs = tmp_path_factory.mktemp("logs")
    flags = [
        "--disable-radix-cache",
        # Every miss drafted by the head just in time (`auto` picks n-grams at batch 1 once it
        # has measured this weak head), so every round measures the head.
        *("--ssd-backup", "jit"),
        # Depth pinned at γ: self-tuned, D follows the speculator's speed against the target's
        # on this machine (D = 1 on an AMX Xeon, where a hit carries at most 2 tokens), and the
        # accept length would measure the machine rather than the head.
        *("--ssd-tree-depth", "4"),
        # The geometric fan-out, for the same reason: the predicted one caches more outcomes,
        # so more rounds are served by the head's tree drafts (its own hidden states past the
        # verified prefix) than by just-in-time drafts on the target's features, and the
        # accept length would measure the hit rate rather than the head.
        *("--ssd-fanout", "geometric"),
    ]
    with Server("head", ssd_args(tiny_target, head, flags), log_path=logs / "head.log") as ssd:
        yield {"ar": tiny_servers["ar"], "head": ssd}


def _generate(server: Server, prompt: str) -> dict:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0}}
    response = requests.post(f"{server.url}/generate", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


def _stats(server: Server) -> dict:
    return requests.get(f"{server.url}/ssd/stats", timeout=60).json()


def _head_accept_length(before: dict, after: dict) -> tuple[float, int, int]:
    """(accept length of the head's drafts, rounds it drafted, all rounds) between two
    `/ssd/stats` snapshots."""

    def delta(group: str, key: str) -> int:
        return int(after[group].get(key, 0)) - int(before[group].get(key, 0))

    rounds = sum(delta("rounds_by_source", s) for s in HEAD_SOURCES)
    accepted = sum(delta("accepted_by_source", s) for s in HEAD_SOURCES)
    total = int(after["request_rounds"]) - int(before["request_rounds"])
    return 1.0 + accepted / max(rounds, 1), rounds, total


def test_greedy_matches_autoregressive_and_the_head_drafts(servers) -> None:
    before = _stats(servers["head"])
    for prompt in _prompts():
        expected = _generate(servers["ar"], prompt)
        got = _generate(servers["head"], prompt)
        assert got["output_ids"] == expected["output_ids"], prompt
    accept, head_rounds, rounds = _head_accept_length(before, _stats(servers["head"]))
    assert head_rounds == rounds > 0, (head_rounds, rounds)  # the head drafted every round
    assert accept > 1.2, (accept, head_rounds)


def test_concurrent_greedy_matches_autoregressive(servers) -> None:
    prompts = _prompts()
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        expected = list(pool.map(lambda p: _generate(servers["ar"], p), prompts))
        got = list(pool.map(lambda p: _generate(servers["head"], p), prompts))
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]


def test_a_repeated_prompt_is_drafted_by_the_head_again(servers) -> None:
    """With the radix cache off the repeat is prefilled in full, so its features reach the
    speculator again: the second request is drafted by the head like the first; no request's
    features stay buffered on the target afterwards."""
    prompt = _prompts()[1]
    runs = []
    for _ in range(2):
        before = _stats(servers["head"])
        out = _generate(servers["head"], prompt)
        runs.append((out["output_ids"], _head_accept_length(before, _stats(servers["head"]))))
    (first, (_, head1, rounds1)), (second, (_, head2, rounds2)) = runs
    assert first == second
    assert head1 == rounds1 > 0 and head2 == rounds2 > 0, runs
    assert _stats(servers["head"])["speculator"]["target_features_buffered"] == 0


def test_every_arrangement_keeps_the_heads_greedy_output(servers) -> None:
    """An EAGLE-3 head speculator gets the same arrangements (`--ssd-mode`, switched live):
    sync rounds draft with the head just in time on every core, plain rounds ship their
    features with the next Step, auto switches between them; the output stays the target's."""
    url = servers["head"].url
    try:
        for mode in ("sync", "plain", "auto"):
            assert requests.post(f"{url}/ssd/config", json={"mode": mode}, timeout=60).ok
            before = _stats(servers["head"])["speculator"]
            for prompt in _prompts()[:2]:
                expected = _generate(servers["ar"], prompt)
                got = _generate(servers["head"], prompt)
                assert got["output_ids"] == expected["output_ids"], (mode, prompt)
            after = _stats(servers["head"])
            if mode != "auto":
                ran = after["speculator"][f"{mode}_rounds"] - before[f"{mode}_rounds"]
                assert ran > 0, (mode, after["speculator"])
            assert after["faults"] == 0, after
    finally:
        requests.post(f"{url}/ssd/config", json={"mode": "async"}, timeout=60)

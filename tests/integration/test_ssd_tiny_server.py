"""SSD served by a real SGLang server on tiny random models: lossless greedy, batching, processes.

Real servers, real sockets, a real speculator process; tiny models keep it to about a minute.
Greedy SSD (async; and `auto` switching arrangement every round, async / sync / plain in turn,
with a reduced draft vocabulary) must reproduce the autoregressive server token for token, also
with concurrent requests of different lengths and with the radix cache hit by a repeated prompt.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import requests
from pair_servers import ssd_stats
from tiny_servers import TINY_FLAGS
from transformers import AutoConfig, AutoTokenizer

from eval.servers import Server, started_together
from sglang_ssd.build.vocab import count_ids, top_ids
from sglang_ssd.config import CYCLE_ENV
from sglang_ssd.launch import zygote
from sglang_ssd.speculator import draft_vocab
from sglang_ssd.testing.corpus import tiny_corpus
from sglang_ssd.testing.processes import speculators

VOCAB = 40  # `--ssd-draft-vocab` of the "cycle-vocab" server: 40 of the tiny tokenizer's 96 tokens
PROMPTS = ["hello world", "def f(x): return", "abcabcabcabc", "the quick brown fox", "zzz", "1"]


@pytest.fixture(scope="module")
def vocab_cache(tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A cache holding the tiny draft's `VOCAB` most frequent ids on its training corpus (what
    `--ssd-draft-vocab VOCAB` loads there): (cache folder, ids kept with EOS)."""
    cache = tmp_path_factory.mktemp("cache")
    tokenizer = AutoTokenizer.from_pretrained(tiny_draft)
    vocab_size = AutoConfig.from_pretrained(tiny_draft).vocab_size
    counts = count_ids(tokenizer, [tiny_corpus()], vocab_size)
    ids = top_ids(counts, VOCAB, [tokenizer.eos_token_id])
    vocab = draft_vocab.DraftVocab(ids, vocab_size, "tiny corpus")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SGLANG_SSD_CACHE", str(cache))
        draft_vocab.save(vocab, tiny_draft, VOCAB)
    return cache, vocab.size


@pytest.fixture(scope="module")
def own_servers(
    tiny_target: Path,
    tiny_draft: Path,
    vocab_cache: tuple[Path, int],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mapping[str, Server]]:
    """The SSD server this module needs its own flags for: `--ssd-mode auto` forced to switch
    arrangement every round (`config.CYCLE_ENV`) with a reduced draft vocabulary (one server
    for both: a start-up costs ~30 s of CI, and a fault in either shows in its greedy output or
    its statistics)."""
    logs = tmp_path_factory.mktemp("logs")
    common = ["--model-path", str(tiny_target), *TINY_FLAGS]
    spec = ["--speculative-draft-model-path", str(tiny_draft), "--speculative-algorithm", "SSD"]
    configs = {
        "cycle-vocab": [*common, *spec, "--ssd-mode", "auto", "--ssd-draft-vocab", str(VOCAB)]
    }
    env = {"SGLANG_SSD_CACHE": str(vocab_cache[0]), CYCLE_ENV: "1"}
    made = {
        name: Server(name, args, log_path=logs / f"{name}.log", env=env)
        for name, args in configs.items()
    }
    with started_together(made):
        yield made


@pytest.fixture
def servers(
    tiny_ar: Server, tiny_ssd: Server, own_servers: Mapping[str, Server]
) -> dict[str, Server]:
    """The session's shared AR and SSD servers and this module's own."""
    return {"ar": tiny_ar, "ssd": tiny_ssd, **own_servers}


def _generate(server: Server, prompt: str, max_new_tokens: int = 40, **sampling) -> dict:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, **sampling}}
    response = requests.post(f"{server.url}/generate", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


@pytest.mark.parametrize("mode", ["ssd", "cycle-vocab"])
def test_greedy_matches_autoregressive(servers, mode):
    """Also across a switch of arrangement every round ("cycle-vocab": sync, async and plain
    in turn, so every pair of them meets and the cores move each round)."""
    before = ssd_stats(servers[mode])
    for i, prompt in enumerate(PROMPTS):
        n = 10 + 7 * i
        expected = _generate(servers["ar"], prompt, n, temperature=0)
        got = _generate(servers[mode], prompt, n, temperature=0)
        assert got["output_ids"] == expected["output_ids"], prompt
        assert got["meta_info"]["spec_verify_ct"] > 0
    if mode == "cycle-vocab":
        after = ssd_stats(servers[mode])
        ran = {
            a: after["speculator"][f"{a}_rounds"] - before["speculator"][f"{a}_rounds"]
            for a in ("sync", "async", "plain")
        }
        assert min(ran.values()) >= 10 and max(ran.values()) - min(ran.values()) <= 6, ran
        lent = after["speculator"]["cores_lent"] - before["speculator"]["cores_lent"]
        assert lent >= ran["sync"] + ran["plain"]
        assert after["faults"] == before["faults"] == 0


def test_reduced_draft_vocabulary_is_in_use(servers, vocab_cache):
    """`--ssd-draft-vocab`: the speculator drafts from the kept ids only, and the target, which
    often wants another id, still gets its exact output (the greedy test above). A sampled
    request's q crosses at the kept ids' width and is scattered back: every
    round verifies it, without a fault or a restart."""
    kept = vocab_cache[1]
    out = _generate(servers["cycle-vocab"], "def f(x):", 24, temperature=0.8, ignore_eos=True)
    assert out["meta_info"]["completion_tokens"] == 24 and out["meta_info"]["spec_verify_ct"] > 0
    stats = ssd_stats(servers["cycle-vocab"])
    assert stats["speculator"]["draft_vocab_size"] == kept
    assert stats["faults"] == 0 and stats["restarts"] == 0, stats
    full = ssd_stats(servers["ssd"])
    assert full["speculator"]["draft_vocab_size"] > kept
    assert (stats["ssd_mode"], full["ssd_mode"]) == ("auto", "async")  # `--ssd-mode` served
    assert stats["arrangements"]["offered"] == ["sync", "async", "plain"]


def test_concurrent_greedy_matches_autoregressive(servers):
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        expected = list(pool.map(lambda p: _generate(servers["ar"], p, temperature=0), PROMPTS))
        got = list(pool.map(lambda p: _generate(servers["ssd"], p, temperature=0), PROMPTS))
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]


def test_sampling_runs_and_stops_at_max_tokens(servers):
    # ignore_eos: a random tiny model samples EOS early now and then.
    out = _generate(
        servers["ssd"], "hello", 33, temperature=0.8, top_p=0.9, top_k=20, ignore_eos=True
    )
    assert out["meta_info"]["completion_tokens"] == 33


def test_speculator_is_a_separate_process_on_disjoint_cores(servers):
    found = speculators(servers["ssd"].proc.pid)
    assert len(found) == 1
    scheduler = found[0].target
    assert scheduler.pid != servers["ssd"].proc.pid and "scheduler" in scheduler.name()
    # Forked from the launcher's speculator zygote, its imports done (`sglang_ssd.launch.zygote`).
    assert zygote.argv_of(found[0].process.ppid()) == [zygote.TITLE]
    target_cpus = set(os.sched_getaffinity(scheduler.pid))
    draft_cpus = set(os.sched_getaffinity(found[0].process.pid))
    assert target_cpus and draft_cpus and not target_cpus & draft_cpus


def _switching_mid_request(servers, prompt: str) -> tuple[dict, dict]:
    """One 150-token greedy request on the shared SSD server while the live `mode` cycles
    plain / sync / auto / async every 50 ms (back to async at the end); returns (SSD's
    response, AR's response to the same request)."""
    url, n = servers["ssd"].url, 150
    expected = _generate(servers["ar"], prompt, n, temperature=0, ignore_eos=True)
    values = itertools.cycle(["plain", "sync", "auto", "async"])
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            run = pool.submit(_generate, servers["ssd"], prompt, n, temperature=0, ignore_eos=True)
            while not run.done():
                body = {"mode": next(values)}
                assert requests.post(f"{url}/ssd/config", json=body, timeout=60).ok
                time.sleep(0.05)
            got = run.result()
    finally:
        requests.post(f"{url}/ssd/config", json={"mode": "async"}, timeout=60)
    return got, expected


def test_mode_switched_mid_request_keeps_greedy_output(servers):
    """`--ssd-mode` switched live while one long request decodes: plain rounds (no draft, the
    speculator stopped, its core lent) hand their tokens to the speculator with the next Step
    (`Outcome.extra`), sync rounds draft just in time on every core and verify on every core,
    each switch back to async starts from a cold cache, and the output stays the target's; a
    stopped speculator never looked dead or late."""
    before = ssd_stats(servers["ssd"])
    got, expected = _switching_mid_request(servers, PROMPTS[1])
    assert got["output_ids"] == expected["output_ids"]
    meta = got["meta_info"]
    assert 0 < meta["ssd_plain_rounds"] < meta["ssd_rounds"]
    after = ssd_stats(servers["ssd"])
    ran = {
        a: after["speculator"][f"{a}_rounds"] - before["speculator"][f"{a}_rounds"]
        for a in ("sync", "async", "plain")
    }
    assert min(ran.values()) > 0, ran
    lent = after["speculator"]["cores_lent"] - before["speculator"]["cores_lent"]
    assert lent >= ran["sync"] + ran["plain"]
    assert after["plain_rounds"]["rounds"] >= meta["ssd_plain_rounds"]
    assert after["faults"] == before["faults"]


def test_prefills_lend_the_speculators_core_by_arrangement_and_keep_greedy_output(servers):
    """Under async a short prefill runs on the target's cores alone; under sync (the speculator
    idles between rounds) every prefill runs on the speculator's core too (the speculator
    stopped, then prefilling the draft after it). Output stays the target's."""
    url = servers["ssd"].url

    def lent() -> float:
        return ssd_stats(servers["ssd"])["speculator"]["cores_lent"]

    try:
        for mode, lends in (("async", False), ("sync", True)):
            assert requests.post(f"{url}/ssd/config", json={"mode": mode}, timeout=60).ok
            prompts = [f"{p} {mode}" for p in PROMPTS[:3]]  # new each time: no cache hit
            before = lent()
            for prompt in prompts:  # one token each: the prefill alone, no decode round
                want = _generate(servers["ar"], prompt, 1, temperature=0, ignore_eos=True)
                got = _generate(servers["ssd"], prompt, 1, temperature=0, ignore_eos=True)
                assert got["output_ids"] == want["output_ids"], (mode, prompt)
            assert lent() - before == (len(prompts) if lends else 0), mode
    finally:
        requests.post(f"{url}/ssd/config", json={"mode": "async"}, timeout=60)


def test_tree_depth_is_self_tuned_until_pinned(servers):
    """Default: the target picks D each round (`DepthTuner`) and sends it with the Step;
    `POST /ssd/config {"tree_depth": 1}` pins it, the speculator builds at D = 1 from then on,
    and greedy output stays the target's; 0 self-tunes again."""
    url = servers["ssd"].url
    _generate(servers["ssd"], PROMPTS[0], 8, temperature=0)  # the tuner has measured a round
    stats = ssd_stats(servers["ssd"])["speculator"]
    assert stats["tree_depth_pinned"] == 0.0
    assert 1 <= stats["tree_depth"] <= 4 and stats["tuner_t_forward_s"] > 0
    assert stats["build_tree_depth"] == stats["tree_depth"]
    reply = requests.post(f"{url}/ssd/config", json={"tree_depth": 1}, timeout=60)
    assert reply.status_code == 200, reply.text
    prompt = PROMPTS[1]
    expected = _generate(servers["ar"], prompt, 30, temperature=0)
    got = _generate(servers["ssd"], prompt, 30, temperature=0)
    assert got["output_ids"] == expected["output_ids"]
    stats = ssd_stats(servers["ssd"])["speculator"]
    assert (stats["tree_depth"], stats["tree_depth_pinned"], stats["build_tree_depth"]) == (
        1.0,
        1.0,
        1.0,
    )
    bad = requests.post(f"{url}/ssd/config", json={"tree_depth": 5}, timeout=60)
    assert bad.status_code == 400 and "0..γ=4" in bad.text
    # 0 self-tunes again: set "auto" by /ssd/config, as at start, and no longer pinned.
    reply = requests.post(f"{url}/ssd/config", json={"tree_depth": 0}, timeout=60)
    assert reply.status_code == 200 and reply.json()["settings"]["tree_depth"] == "auto"
    _generate(servers["ssd"], prompt, 8, temperature=0)
    stats = ssd_stats(servers["ssd"])["speculator"]
    assert stats["tree_depth_pinned"] == 0.0

"""Stops that fire inside an accepted SSD block, on the tiny trained pair.

A verify round commits up to γ + 1 tokens at once; SGLang's scheduler then finds the first stop
among them and drops the rest. Each stop kind is swept over the output positions
n = 1 .. `MAX_POSITION` of the AR server's greedy output, so, with blocks of at most γ + 1
tokens, it lands at every offset of the blocks SSD accepts:

- `length`: `max_new_tokens = n`;
- `eos`: the target's EOS (`~`, the line break, added in its generation config); the prompt is
  a base prompt plus its first greedy tokens, so that the first `~` is output n;
- `eos_then_stop_str`: the same, plus a stop string that completes one token after the EOS
  (the EOS and the token after it): plain decoding stops at the EOS, and so must SSD when both
  land in one accepted run (SGLang alone would report the stop string; `finish_order`);
- `stop_token_id`: `stop_token_ids = [the id emitted at n]` (its first occurrence);
- `stop_str`: `stop = [the shortest decoded tail ending at n not seen before]`;
- `stop_regex`: `stop_regex`, that tail with its last character as a class;
- `stop_regex_end`: the same anchored with `$` (SGLang rescans a multi-token step for it).

Every SSD response must equal the AR server's: text, output ids, `finish_reason` (type and
matched) and `completion_tokens`. And the sweep must have exercised what it claims: every kind
must have fired at every offset 0..γ of a fully accepted round (γ + 1 tokens), and SSD must have
served cache hits. A response's `spec_correct_drafts_histogram` against its `completion_tokens`
gives the tokens its final round accepted past the stop (the overshoot); the offset is known
when every round that could have been the final one accepted all γ drafts, or else when the
prompt's `length` sweep put output n in a full round ending where this request's final round
ended. (SSD's rounds are not fully reproducible from batch to batch: its fan-out adapts to the
hits so far.)

All requests of a kind go to each server as one batched `/generate`.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from pair_servers import ar_and_ssd

from eval.servers import Server
from sglang_ssd.testing.tiny_models import tokenize

GAMMA = 4
MAX_POSITION = 14
REFERENCE_TOKENS = 40
EOS_CHAR = "~"  # the tiny corpus's line break, emitted every line
(EOS_ID,) = tokenize(EOS_CHAR)
# Prompts of the kind the pair was trained on (code and prose, lines broken by `~`).
BASE_PROMPTS = (
    "def compute_total(items, limit):~    ",
    "def merge_node(left, right):~    if left > 3:~",
    "def parse_token(batch):~    for index in range(",
    "Each draft token",
    "the quick model",
    "def f(x):~    return",
    "    return ",
    "x = ",
    "    if score > 2:~        ",
    "def render_buffer(prefix):~    total = ",
    "    result = ",
    "def search_name(",
    "a small cache",
)
KINDS = (
    "length",
    "eos",
    "eos_then_stop_str",
    "stop_token_id",
    "stop_str",
    "stop_regex",
    "stop_regex_end",
)


@dataclass(frozen=True)
class Case:
    """One request of a sweep: `sampling` puts a stop of `kind` at output position `position`."""

    kind: str
    prompt: str
    position: int
    sampling: dict[str, Any]


@dataclass
class Sweep:
    """A kind's cases and both servers' responses, in case order."""

    cases: list[Case]
    ar: list[dict[str, Any]]
    ssd: list[dict[str, Any]]


@pytest.fixture(scope="module")
def eos_target(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with `~` as a second EOS id (generation config; weights unchanged)."""
    path = tmp_path_factory.mktemp("eos-target") / "target"
    shutil.copytree(tiny_target, path)
    config_path = path / "generation_config.json"
    config = json.loads(config_path.read_text())
    config["eos_token_id"] = [config["eos_token_id"], EOS_ID]
    config_path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def servers(
    eos_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Server]]:
    logs = tmp_path_factory.mktemp("stop-logs")
    # Stops must land at every offset of fully accepted rounds (γ + 1 tokens): a cache hit
    # carries D tokens, so D is pinned to γ rather than self-tuned.
    flags = ["--speculative-num-steps", str(GAMMA), "--ssd-tree-depth", str(GAMMA)]
    with ar_and_ssd(eos_target, tiny_draft, logs, flags) as made:
        yield made


def _generate(server: Server, prompts: Sequence[str], sampling: Sequence[dict]) -> list[dict]:
    """One batched greedy `/generate`: the responses in request order."""
    params = [{"temperature": 0, **s} for s in sampling]
    body = {"text": list(prompts), "sampling_params": params}
    response = requests.post(f"{server.url}/generate", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


@pytest.fixture(scope="module")
def tokenizer(eos_target: Path) -> Any:
    """The tokenizer as SGLang's scheduler loads it (its stop checks decode with it)."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(str(eos_target))


@pytest.fixture(scope="module")
def reference(servers: dict[str, Server]) -> dict[str, list[int]]:
    """Each base prompt's AR greedy output ids (EOS ignored), `REFERENCE_TOKENS` long."""
    sampling = [{"max_new_tokens": REFERENCE_TOKENS, "ignore_eos": True}] * len(BASE_PROMPTS)
    outputs = _generate(servers["ar"], BASE_PROMPTS, sampling)
    return {p: out["output_ids"] for p, out in zip(BASE_PROMPTS, outputs, strict=True)}


def _eos_prompts(reference: dict[str, list[int]], tokenizer: Any) -> list[tuple[str, int, str]]:
    """(prompt, n, after): a base prompt extended by its first greedy tokens so that its first
    `~` is output n, for every n ≤ MAX_POSITION the base allows; `after` is the decoded text of
    that `~` and the token after it (a stop string that completes one token past the EOS)."""
    prompts = []
    for base in BASE_PROMPTS:
        ids = reference[base]
        if EOS_ID not in ids[:-1]:
            continue
        first = ids.index(EOS_ID)
        after = tokenizer.decode(ids[first : first + 2])
        for n in range(1, min(MAX_POSITION, first + 1) + 1):
            prefix = "".join(tokenizer.convert_ids_to_tokens(ids[: first + 1 - n]))
            prompts.append((base + prefix, n, after))
    return prompts


def _stop_tail(ids: list[int], n: int, decode: Callable[[list[int]], str]) -> str | None:
    """The shortest decoded tail (1..3 tokens) ending at output n that occurs nowhere in the
    first n - 1 outputs, or None."""
    before = decode(ids[: n - 1])
    for k in range(1, min(n, 3) + 1):
        tail = decode(ids[n - k : n])
        if tail.strip() and tail not in before:
            return tail
    return None


def _stop_sampling(kind: str, ids: list[int], n: int, tokenizer: Any) -> dict | None:
    """Sampling parameters that stop at output n by `kind`, or None where none can."""
    limit = {"max_new_tokens": MAX_POSITION + 6}
    if kind == "stop_token_id":
        if ids[n - 1] in ids[: n - 1] or EOS_ID in ids[:n]:
            return None
        return {**limit, "stop_token_ids": [ids[n - 1]], "ignore_eos": False}
    tail = _stop_tail(ids, n, tokenizer.decode)
    if tail is None:
        return None
    if kind == "stop_str":
        return {**limit, "stop": [tail], "ignore_eos": True}
    pattern = re.escape(tail[:-1]) + "[" + re.escape(tail[-1]) + "]"
    if kind == "stop_regex_end":
        pattern += "$"
    if re.search(pattern, tokenizer.decode(ids[: n - 1])):
        return None
    return {**limit, "stop_regex": [pattern], "ignore_eos": True}


def _cases(kind: str, reference: dict[str, list[int]], tokenizer: Any) -> list[Case]:
    eos_prompts = _eos_prompts(reference, tokenizer)
    if kind in ("eos", "eos_then_stop_str"):
        limit = {"max_new_tokens": MAX_POSITION + 6}
        return [
            Case(kind, p, n, {**limit, "stop": [after]} if kind != "eos" else limit)
            for p, n, after in eos_prompts
        ]
    if kind == "length":
        # Every position of the base prompts; for the EOS prompts, the positions whose rounds
        # locate the one holding their EOS (the previous round ends at most γ + 1 before it).
        spans = [(p, range(1, MAX_POSITION + 1)) for p in BASE_PROMPTS]
        spans += [(p, range(max(1, n - GAMMA - 1), n + 1)) for p, n, _ in eos_prompts]
        return [
            Case(kind, p, n, {"max_new_tokens": n, "ignore_eos": True})
            for p, positions in spans
            for n in positions
        ]
    cases = []
    for prompt in BASE_PROMPTS:
        for n in range(1, MAX_POSITION + 1):
            sampling = _stop_sampling(kind, reference[prompt], n, tokenizer)
            if sampling is not None:
                cases.append(Case(kind, prompt, n, sampling))
    return cases


@pytest.fixture(scope="module")
def sweeps(
    servers: dict[str, Server], reference: dict[str, list[int]], tokenizer: Any
) -> Callable[[str], Sweep]:
    """`sweeps(kind)`: the kind's cases sent to both servers (each kind once per module)."""
    done: dict[str, Sweep] = {}

    def sweep(kind: str) -> Sweep:
        if kind not in done:
            cases = _cases(kind, reference, tokenizer)
            prompts, sampling = [c.prompt for c in cases], [c.sampling for c in cases]
            ar = _generate(servers["ar"], prompts, sampling)
            ssd = _generate(servers["ssd"], prompts, sampling)
            done[kind] = Sweep(cases, ar, ssd)
        return done[kind]

    return sweep


def _observed(response: dict[str, Any]) -> tuple[Any, ...]:
    meta = response["meta_info"]
    return (response["text"], response["output_ids"], meta["finish_reason"],
            meta["completion_tokens"])  # fmt: skip


def _overshoot(meta: dict[str, Any]) -> int:
    """Tokens the request's final verify round accepted past its stop (the scheduler dropped
    them): the decode rounds' tokens (accepted drafts + bonus each) minus the outputs after the
    prefill's first token."""
    histogram = meta.get("spec_correct_drafts_histogram") or []
    committed = sum(rounds * (k + 1) for k, rounds in enumerate(histogram))
    return committed - (meta["completion_tokens"] - 1)


def _block_ends(length: Sweep) -> dict[str, list[int]]:
    """Per prompt, the output positions where SSD's verify rounds ended (the prefill's token
    is position 1), from the length sweep: a request cut at n ended its last round at n plus
    the tokens that round accepted past n."""
    ends: dict[str, set[int]] = {}
    for case, response in zip(length.cases, length.ssd, strict=True):
        meta = response["meta_info"]
        ends.setdefault(case.prompt, set()).add(meta["completion_tokens"] + _overshoot(meta))
    return {prompt: sorted(found) for prompt, found in ends.items()}


def _own_full_block_offset(meta: dict[str, Any]) -> int | None:
    """The stop's offset in its final round when the response alone proves that round fully
    accepted: the final round accepted at least `overshoot` drafts, and every round that did
    accepted all γ. None otherwise."""
    overshoot = _overshoot(meta)
    histogram = meta.get("spec_correct_drafts_histogram") or []
    could_be_final = {k for k, rounds in enumerate(histogram) if rounds and k >= overshoot}
    return GAMMA - overshoot if could_be_final == {GAMMA} else None


def _length_block_offset(n: int, overshoot: int, bounds: list[int]) -> int | None:
    """The offset of output n in its round when the length sweep's rounds (`bounds`, the
    prompt's round ends) put it in a fully accepted one that ends where this request's final
    round ended (the same rounds in both runs). None otherwise."""
    later = [i for i, end in enumerate(bounds) if end >= n]
    if not later or later[0] == 0 or bounds[later[0]] != n + overshoot:
        return None
    start = bounds[later[0] - 1] + 1
    return n - start if bounds[later[0]] - start == GAMMA else None


def _full_block_offsets(sweep: Sweep, ends: dict[str, list[int]]) -> set[int]:
    """Offsets within fully accepted rounds (γ + 1 tokens) at which the kind's stops fired, as
    the kind intends (finish type), by the response's own counts or the length sweep's."""
    wanted = "length" if sweep.cases[0].kind == "length" else "stop"
    offsets = set()
    for case, response in zip(sweep.cases, sweep.ssd, strict=True):
        meta = response["meta_info"]
        if meta["finish_reason"]["type"] != wanted:
            continue
        offset = _own_full_block_offset(meta)
        if offset is None:
            bounds = ends.get(case.prompt, [])
            offset = _length_block_offset(meta["completion_tokens"], _overshoot(meta), bounds)
        if offset is not None:
            offsets.add(offset)
    return offsets


@pytest.mark.parametrize("kind", KINDS)
def test_stop_inside_accepted_blocks_matches_autoregressive(
    sweeps: Callable[[str], Sweep], kind: str
) -> None:
    sweep = sweeps(kind)
    assert len(sweep.cases) >= MAX_POSITION, f"{kind}: only {len(sweep.cases)} stops placed"
    wrong = [
        f"{c.prompt!r} n={c.position} {c.sampling}: SSD {_observed(s)} != AR {_observed(a)}"
        for c, a, s in zip(sweep.cases, sweep.ar, sweep.ssd, strict=True)
        if _observed(s) != _observed(a)
    ]
    assert not wrong, f"{len(wrong)} of {len(sweep.cases)} differ:\n" + "\n".join(wrong[:10])

    hits = sum(r["meta_info"].get("ssd_cache_hit_rate", 0.0) > 0 for r in sweep.ssd)
    assert hits, f"{kind}: no SSD request was served from the speculation cache"
    offsets = _full_block_offsets(sweep, _block_ends(sweeps("length")))
    assert offsets == set(range(GAMMA + 1)), (
        f"{kind}: stops fired at offsets {sorted(offsets)} of fully accepted blocks, "
        f"not at every offset 0..{GAMMA}"
    )

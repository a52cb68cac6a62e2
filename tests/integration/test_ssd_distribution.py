"""SSD at T = 0.7 samples exactly the target's distribution: a server-level chi-square test.

Setup (`tiny_distribution.py` has the details and the numbers):
- A tiny float32 Qwen2 target whose next-token laws put most mass on a handful of tokens, and a
  draft made of its embedding and first layer with a flatter logit scale: Σ min(p, q) ≈ 0.5, so
  drafts are rejected about half the time.
- An autoregressive server, then one SSD server (`--speculative-num-steps 2`) sampled under
  three settings switched live through `POST /ssd/config` (a server per setting if that
  endpoint is missing): the defaults (β = 1, backup "auto", which picks the n-gram backup at
  these batch sizes: point-mass drafts), backup "jit" (every draft sampled from q), and
  β = 0.5 with "jit" (Saguaro sampling: q is the down-weighted σ). One server at a time: an
  idle SGLang CPU scheduler busy-polls a core. 2048 samples per prompt and configuration, from
  batched `/generate` requests (`input_ids`, two prompts interleaved, T = 0.7, default
  top-k/top-p, `ignore_eos`).
- The reference is exact: the joint law of the first four generated tokens, enumerated with
  transformers in float32 (softmax in float64) over every continuation, a prefix below
  probability 1e-6 kept as one cell.

Why four tokens with γ = 2: token 1 comes from SGLang's prefill sampler, tokens 2–4 from SSD.
They are one whole SSD round when both drafts are accepted (d_1, d_2, then the bonus from p at
position γ + 1), and otherwise hold a rejection's residual bonus (k = 0 or 1) followed by a
second round after the KV rollback, drafted from the speculation cache or the backup. So the
joint of tokens 1–4 covers every verify outcome and the hand-off between rounds; tokens 2–3
under γ = 4 would never show an all-accepted bonus (it lands at token 6). Observed in one run
(4096 requests per setting; rounds by accepted drafts k = 0/1/2; cache hit rate over all rounds
and, in brackets, over the rounds after a request's first, which is always a backup round):

    setting          rounds  k = 0 / 1 / 2         accept length  cache hits   χ² p-value
    defaults (ngram) 7147    2976 / 825 / 3346     2.05           0.24 (0.57)  0.54
    jit              6806    2272 / 1462 / 3072    2.12           0.23 (0.58)  0.83
    β = 0.5, jit     7422    3040 / 1875 / 2507    1.93           0.30 (0.66)  0.27
    autoregressive                                                             0.48

Statistic: Pearson's χ² over each prompt's cells, merged in increasing order of probability
until every group expects ≥ 5 samples (a rule fixed by the reference before any data), summed
over the two prompts (df = 43 + 39), rejected at α = 0.001.

Power, by simulation (`python tests/integration/tiny_distribution.py 4 1024 2048 4096`): the
smallest total variation over the 4-token joint that the test rejects with ≥ 90% probability,
for mixtures (1 − ε)·p + ε·a in four directions a:

    samples/prompt  hardest  toward the mode  bonus from p  q at T=1 in verify
    1024            0.093    0.075            0.055         0.042
    2048 (here)     0.070    0.058            0.040         0.030
    4096            0.053    0.043            0.030         0.023

"hardest" scales the likelier half of the mass up and the rest down in proportion, the
direction of least χ² noncentrality per unit of TV (see `half_law`): so, to the usual
noncentral-χ² approximation, at 2048 samples per prompt any bias that moves ≥ 0.07 of
probability between merged groups is caught with ≥ 90% probability. A bias
confined to one pool of merged tail cells is invisible (those pools hold 6.6% and 4.6% of the
mass). "toward the mode" is a skew to the most likely sequence (the direction of the reference
code's argmax-matching bug); "bonus from p" draws the bonus from p instead of the residual; "q
at T=1" verifies with the draft's q at T = 1 though it sampled at T = 0.7. As whole verifiers
the last two are far beyond the threshold (TV 0.26–0.43, always rejected); applied to one
token in five, "q at T=1" (TV 0.05 / 0.07) is rejected with probability 0.9995.
`test_statistic_rejects_broken_verifiers` runs these through the same statistic without a
server, and checks that exact speculative sampling passes.

Each server check has a 0.1% chance of a false alarm (samples depend on batch timing, so runs
differ). The same check against the autoregressive server guards the reference: if both fail
alike, the reference is wrong, not SSD. About 2.5 minutes on 2 cores shared with other jobs
(load 4–5), over half of it server start-up and shut-down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import torch
from tiny_distribution import (
    BROKEN,
    PROMPTS,
    TEMPERATURE,
    Cells,
    build_pair,
    chi_square,
    enumerate_cells,
    load,
    model_conditionals,
    speculative_samples,
    total_variation,
)

from eval.servers import Server

LOOKAHEAD = 2
NEW_TOKENS = LOOKAHEAD + 2
SAMPLES_PER_PROMPT = 2048
REQUESTS_PER_POST = 512
STARTUP_TIMEOUT_S = 900.0
# SSD settings sampled on one server, changed live through `POST /ssd/config` (or, without the
# admin endpoint, one server each). "auto" picks the n-gram backup at these batch sizes.
SSD_CONFIGS: dict[str, dict[str, Any]] = {
    "ssd": {"beta": 1.0, "backup": "auto"},
    "ssd_jit": {"beta": 1.0, "backup": "jit"},
    "ssd_beta_0.5": {"beta": 0.5, "backup": "jit"},
}
CONFIGS = ["ar", *SSD_CONFIGS]


@dataclass
class Pair:
    target_dir: Path
    draft_dir: Path
    target: torch.nn.Module
    draft: torch.nn.Module
    cells: list[Cells]


@dataclass
class Draws:
    """What one configuration produced: per prompt the sampled continuations, and round stats."""

    samples: list[list[tuple[int, ...]]]
    metas: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Verify rounds, accepted-draft histogram (k = 0..γ), accept length (bonus included),
        cache hit rates and backup rounds by kind (the last two from SSD's `meta_info`)."""
        rounds = sum(m.get("spec_verify_ct", 0) for m in self.metas)
        hist = np.zeros(LOOKAHEAD + 1, dtype=np.int64)
        for m in self.metas:
            h = m.get("spec_correct_drafts_histogram") or []
            hist[: len(h)] += np.asarray(h[: LOOKAHEAD + 1], dtype=np.int64)
        out: dict[str, Any] = {"requests": len(self.metas), "rounds": rounds}
        if hist.sum():
            out["accept_hist"] = hist.tolist()
            out["accept_length"] = round(1 + float(np.arange(LOOKAHEAD + 1) @ hist / hist.sum()), 3)
        ssd_rounds = sum(m.get("ssd_rounds", 0) for m in self.metas)
        if ssd_rounds:
            hits = sum(m["ssd_cache_hit_rate"] * m["ssd_rounds"] for m in self.metas)
            out["cache_hit_rate"] = round(hits / ssd_rounds, 3)
            # Every request's first round is a backup round (no cache exists for it yet).
            later = ssd_rounds - len(self.metas)
            if later > 0:
                out["later_rounds_hit_rate"] = round(hits / later, 3)
            backups: dict[str, int] = {}
            for m in self.metas:
                for kind, count in (m.get("ssd_backup_rounds") or {}).items():
                    if count:
                        backups[kind] = backups.get(kind, 0) + count
            out["backup_rounds"] = backups
        return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    """The tiny pair on disk and the exact reference cells of each prompt."""
    target_dir, draft_dir = build_pair(tmp_path_factory.mktemp("ssd-distribution"))
    target, draft = load(target_dir), load(draft_dir)
    conditionals = model_conditionals(target, draft)
    cells = [enumerate_cells(conditionals, prompt, NEW_TOKENS) for prompt in PROMPTS]
    return Pair(target_dir, draft_dir, target, draft, cells)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ssd-distribution-logs")


def _server(name: str, pair: Pair, logs: Path, *extra: str) -> Server:
    args = [
        "--model-path", str(pair.target_dir),
        "--dtype", "float32",
        "--max-total-tokens", "4096",
        "--random-seed", "0",
        *extra,
    ]  # fmt: skip
    return Server(name, args, log_path=logs / f"{name}.log", startup_timeout=STARTUP_TIMEOUT_S)


def _ssd_server(name: str, pair: Pair, logs: Path, *extra: str) -> Server:
    return _server(
        name,
        pair,
        logs,
        "--speculative-algorithm", "SSD",
        "--speculative-draft-model-path", str(pair.draft_dir),
        "--speculative-num-steps", str(LOOKAHEAD),
        *extra,
    )  # fmt: skip


def _draw(server: Server, samples_per_prompt: int = SAMPLES_PER_PROMPT) -> Draws:
    """`samples_per_prompt` continuations of each prompt, the prompts interleaved in batches."""
    draws = Draws(samples=[[] for _ in PROMPTS])
    per_prompt = REQUESTS_PER_POST // len(PROMPTS)
    for start in range(0, samples_per_prompt, per_prompt):
        count = min(per_prompt, samples_per_prompt - start)
        ids = [list(PROMPTS[i % len(PROMPTS)]) for i in range(count * len(PROMPTS))]
        body = {
            "input_ids": ids,
            "sampling_params": {
                "temperature": TEMPERATURE,
                "max_new_tokens": NEW_TOKENS,
                "ignore_eos": True,
            },
        }
        response = requests.post(f"{server.url}/generate", json=body, timeout=600)
        assert response.status_code == 200, response.text[:2000]
        for i, out in enumerate(response.json()):
            assert len(out["output_ids"]) == NEW_TOKENS, out
            draws.samples[i % len(PROMPTS)].append(tuple(out["output_ids"]))
            draws.metas.append(out["meta_info"])
    return draws


def _configure(server: Server, settings: dict[str, Any]) -> bool:
    """Apply SSD settings live (`POST /ssd/config`); False if the server has no such endpoint."""
    response = requests.post(f"{server.url}/ssd/config", json=settings, timeout=120)
    if response.status_code in (404, 405):
        return False
    assert response.status_code == 200, response.text
    current = requests.get(f"{server.url}/ssd/config", timeout=60).json()
    assert {k: current[k] for k in settings} == settings, current
    return True


# One server at a time: an idle SGLang CPU scheduler busy-polls a whole core, so two resident
# servers on two cores slow each other down several-fold.
@pytest.fixture(scope="module")
def ar_draws(pair: Pair, logs: Path) -> Draws:
    with _server("ar", pair, logs, "--speculative-algorithm", "NONE") as server:
        return _draw(server)


@pytest.fixture(scope="module")
def ssd_draws(pair: Pair, logs: Path) -> dict[str, Draws]:
    out: dict[str, Draws] = {}
    with _ssd_server("ssd", pair, logs) as server:
        for name, settings in SSD_CONFIGS.items():
            if not _configure(server, settings):
                break
            out[name] = _draw(server)
    for name, settings in SSD_CONFIGS.items():
        if name not in out:  # no admin endpoint: one server per setting
            flags = ["--ssd-beta", str(settings["beta"]), "--ssd-backup", settings["backup"]]
            with _ssd_server(name, pair, logs, *flags) as server:
                out[name] = _draw(server)
    for name, got in out.items():
        print(f"\n{name}: {got.summary()}")
    return out


def _draws_of(request: pytest.FixtureRequest, name: str) -> Draws:
    if name == "ar":
        return request.getfixturevalue("ar_draws")
    return request.getfixturevalue("ssd_draws")[name]


# ------------------------------------------------------------------------------ tests
def test_pair_is_sharp_and_draft_differs(pair: Pair) -> None:
    """The design's premises: few cells carry the mass, and q is far enough from p."""
    target, draft = pair.target, pair.draft
    for prompt, cells in zip(PROMPTS, pair.cells, strict=True):
        ref = cells.probs["target"]
        assert abs(ref.sum() - 1) < 1e-9
        assert np.sort(ref)[::-1][:20].sum() > 0.5  # a handful of sequences dominate
        with torch.no_grad():
            ids = torch.tensor([list(prompt)])
            p = torch.softmax(target(ids).logits[0, -1].double() / TEMPERATURE, -1)
            q = torch.softmax(draft(ids).logits[0, -1].double() / TEMPERATURE, -1)
        assert p.topk(4).values.sum() > 0.9
        assert 0.3 < float(torch.minimum(p, q).sum()) < 0.8  # drafts often rejected


@pytest.mark.parametrize("bug", [None, *BROKEN])
def test_statistic_rejects_broken_verifiers(pair: Pair, bug: str | None) -> None:
    """Negative control without a server: the same statistic on an in-process speculative
    sampler passes when it is exact, and rejects two classic verify bugs (TV 0.26–0.43) and a
    subtle one (q at T = 1 on one token in five, TV 0.05–0.07, rejected with prob. 0.9995)."""
    generator = torch.Generator().manual_seed(1234)
    counts = [
        cells.counts(
            speculative_samples(
                pair.target, pair.draft, prompt, NEW_TOKENS, SAMPLES_PER_PROMPT, bug, generator
            )
        )
        for prompt, cells in zip(PROMPTS, pair.cells, strict=True)
    ]
    result = chi_square(counts, [c.probs["target"] for c in pair.cells])
    if bug is None:
        assert not result.rejects, result
    else:
        tv = [total_variation(c.probs["target"], c.probs[bug]) for c in pair.cells]
        assert min(tv) > 0.04, tv
        assert result.rejects, (result, tv)


@pytest.mark.parametrize("name", CONFIGS)
def test_first_tokens_match_the_target(
    pair: Pair, request: pytest.FixtureRequest, name: str
) -> None:
    """Joint frequencies of generated tokens 1–4 match the target's exact law (α = 0.001)."""
    got = _draws_of(request, name)
    counts = [cells.counts(s) for cells, s in zip(pair.cells, got.samples, strict=True)]
    refs = [cells.probs["target"] for cells in pair.cells]
    result = chi_square(counts, refs)
    print(f"\n{name}: {result}")
    detail = f"{name}: {result}, {got.summary()}\n{_worst_cells(pair.cells, counts)}"
    assert not result.rejects, detail


@pytest.mark.parametrize("name", list(SSD_CONFIGS))
def test_ssd_rounds_hit_every_verify_outcome(request: pytest.FixtureRequest, name: str) -> None:
    """The samples above came through SSD rounds with rejections (k = 0, 1), all-accepted
    rounds (k = γ, bonus from p), and later rounds drafted from the speculation cache and from
    the configured backup."""
    summary = _draws_of(request, name).summary()
    assert summary["rounds"] > summary["requests"], summary  # some requests had a 2nd round
    assert all(count > 0 for count in summary["accept_hist"]), summary
    assert 0.0 < summary["cache_hit_rate"] < 1.0, summary
    backup = SSD_CONFIGS[name]["backup"]
    if backup != "auto":
        assert set(summary["backup_rounds"]) == {backup}, summary


def _worst_cells(cells: list[Cells], counts: list[np.ndarray], top: int = 8) -> str:
    """The cells (expecting ≥ 1 sample) with the largest standardized residuals, for a failing
    test's message."""
    lines = []
    for prompt, (c, observed) in enumerate(zip(cells, counts, strict=True)):
        n = observed.sum()
        expected = c.probs["target"] * n
        z = np.where(expected >= 1, (observed - expected) / np.sqrt(np.maximum(expected, 1)), 0)
        for i in np.argsort(-np.abs(z))[:top]:
            lines.append(
                f"prompt {prompt} tokens {c.keys[i]}: observed {observed[i]}, "
                f"expected {expected[i]:.1f} (z = {z[i]:+.1f})"
            )
    return "\n".join(lines)

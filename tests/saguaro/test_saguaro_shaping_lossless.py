"""Losslessness of SSD rounds with per-position penalties, min tokens and logit bias (T > 0).

`shape_logits` runs on the target's verify logits before `verify`; position j must see the
output plus the draft prefix d_1 .. d_j, as plain decoding would have
(docs/design.md#options-that-change-p). The
toy decoder, the SSD rounds and the chi-square statistic are those of `test_saguaro_lossless`
(V = 5, the first 3 emitted tokens, 125 cells, N = 300,000 samples, significance 1e-3, draft
depth 3): `run_ssd` drives the rounds and `ShapedVerify` is its verify function. The reference
is the exactly enumerated autoregressive law of the *penalized* target: every prefix's target
logits shaped with a zero-length draft, then `apply_sampling`. The draft's q is the toy draft
table's plain distribution (no penalties); exactness never depends on q.

Repeats within a round are common on this toy: under the unpenalized target 46% of 3-token
outputs hold a repeated token (18% under frequency_penalty 1.5), so counts change inside a round
and a verifier that reuses the round's starting counts (SGLang's relaxed speculative penalties,
`per_position=False`) samples from another law.

Power: an alternative at total-variation distance delta from the reference has noncentrality
lambda >= 4 N delta^2 (Cauchy-Schwarz, as in the lossless module), so the test rejects it with
probability >= ncx2.sf(chi2.ppf(1 - 1e-3, df), df, 4 N delta^2); `tv_at_power` solves for the
delta where that bound is 0.9. Measured with the seeds below (TV of the samples from the exact
penalized law; sampling noise alone gives about 0.005):
- (a) frequency_penalty 1.5: df = 117, 90%-power TV = 0.0083; exact TV = 0.0055, p = 0.61.
- (b) presence 0.8 + repetition 1.4 + min_new_tokens 2 (stop id 4), T = 0.8: df = 72,
  90%-power TV = 0.0075; exact TV = 0.0040, p = 0.35.
- (c) logit_bias {1: +1.5, 3: -2.0}, T = 1.3: df = 121, 90%-power TV = 0.0084; exact TV =
  0.0043, p = 0.65.
- negative control, relaxed form at frequency_penalty 1.5: relaxed TV = 0.163, 90%-power
  threshold = 0.0083 (df = 117), 19.6x the threshold (the test requires >= 2x); p < 1e-300.
Seeds are fixed, so outcomes are deterministic for a given torch build.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from scipy import optimize, stats
from test_saguaro_lossless import (
    N_SAMPLES,
    N_TOKENS,
    SIGNIFICANCE,
    TARGET,
    Config,
    V,
    _record,
    ar_law,
    chi_square,
    min_power,
    next_state,
    run_ssd,
)

from sglang_ssd.saguaro import SamplingBatch, VerifyResult, apply_sampling, verify
from sglang_ssd.saguaro.shaping import RequestOptions, shape_logits

POWER = 0.9
RELAXED_MARGIN = 2.0
STOP_ID = 4

SHAPING: dict[str, tuple[Config, RequestOptions]] = {
    "frequency_penalty": (
        Config("frequency_penalty", depth=3, draft="sampled"),
        RequestOptions((), frequency_penalty=1.5),
    ),
    "presence_repetition_min_new_tokens": (
        Config("presence_repetition_min_new_tokens", depth=3, draft="sampled", temperature=0.8),
        RequestOptions(
            (),
            presence_penalty=0.8,
            repetition_penalty=1.4,
            min_new_tokens=2,
            stop_ids=frozenset({STOP_ID}),
        ),
    ),
    "logit_bias": (
        Config("logit_bias", depth=3, draft="sampled", temperature=1.3),
        RequestOptions((), logit_bias={1: 1.5, 3: -2.0}),
    ),
}


class ShapedVerify:
    """`verify` on shaped target logits, in the place of `run_ssd`'s verify function.

    `run_ssd` passes no output so far, so this keeps its own: `run_ssd` verifies its unfinished
    rows in index order and records each result with `_record`, and the same `_record` on a
    private (out, count, state) tracks every row's output. Each round checks the root logits
    against TARGET[count, state], so a mirror out of step fails loudly instead of shaping with
    the wrong outputs.

    Shaping is per-row Python, so it runs once per distinct (output so far, draft) pair and is
    scattered back: the toy's target logits depend on nothing else.
    """

    def __init__(self, options: RequestOptions, n: int, per_position: bool = True) -> None:
        self.options = options
        self.per_position = per_position
        self.out = torch.full((n, N_TOKENS), -1, dtype=torch.int64)
        self.count = torch.zeros(n, dtype=torch.int64)
        self.state = torch.zeros(n, dtype=torch.int64)

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        sampling: SamplingBatch,
        point_mass: torch.Tensor | None,
        generator: torch.Generator,
    ) -> VerifyResult:
        rows = (self.count < N_TOKENS).nonzero().squeeze(1)
        count = self.count[rows]
        expected_root = TARGET[count, self.state[rows]]
        assert torch.equal(target_logits[:, 0], expected_root), "output mirror out of step"
        shaped = self.shape(self.out[rows], count, target_logits, draft_tokens)
        result = verify(shaped, draft_tokens, draft_probs, sampling, point_mass, generator)
        _record(self.out, self.count, self.state, rows, result)
        return result

    def shape(
        self,
        out: torch.Tensor,
        count: torch.Tensor,
        target_logits: torch.Tensor,
        draft_tokens: torch.Tensor,
    ) -> torch.Tensor:
        """`shape_logits` of [m, D + 1, V] logits, evaluated on the distinct rows only."""
        digits = torch.cat([out, draft_tokens], dim=1) + 1  # -1 (not yet emitted) -> 0
        key = (digits * (V + 1) ** torch.arange(digits.shape[1])).sum(dim=1)
        unique, inverse = torch.unique(key, return_inverse=True)
        rep = torch.empty_like(unique).scatter_(0, inverse, torch.arange(key.shape[0]))
        options = [
            dataclasses.replace(self.options, output_ids=tuple(out[r, : count[r]].tolist()))
            for r in rep.tolist()
        ]
        logits = target_logits[rep]
        shape_logits(logits, draft_tokens[rep], options, per_position=self.per_position)
        return logits[inverse]


def shaped_ar_law(cfg: Config, options: RequestOptions) -> torch.Tensor:
    """Exact law of the first N_TOKENS tokens of plain decoding with `options`: [V ** N_TOKENS].

    Every prefix (lexicographic, as the cells of `chi_square`) gets its target logits shaped
    with a zero-length draft, then temperature/top-k/top-p by `apply_sampling`.
    """
    probs = torch.ones(1, dtype=torch.float64)
    for pos in range(N_TOKENS):
        prefixes = list(itertools.product(range(V), repeat=pos))
        tokens = torch.tensor(prefixes, dtype=torch.int64).reshape(len(prefixes), pos)
        state = torch.zeros(len(prefixes), dtype=torch.int64)
        for i in range(pos):
            state = next_state(state, tokens[:, i])
        logits = TARGET[pos, state].unsqueeze(1).clone()
        rows = [dataclasses.replace(options, output_ids=prefix) for prefix in prefixes]
        shape_logits(logits, torch.zeros(len(prefixes), 0, dtype=torch.int64), rows)
        p = apply_sampling(logits[:, 0], cfg.sampling(len(prefixes))).double()
        probs = (probs.unsqueeze(1) * (p / p.sum(dim=1, keepdim=True))).reshape(-1)
    return probs


def tv_at_power(df: int, power: float = POWER) -> float:
    """The TV delta at which the test's power bound ncx2.sf(critical, df, 4 N delta^2) is
    `power`: alternatives at least this far from the reference are rejected that often."""
    critical = stats.chi2.ppf(1.0 - SIGNIFICANCE, df)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(critical, df, x) - power, 1e-6, 1e4)
    return math.sqrt(lam / (4.0 * N_SAMPLES))


def run_shaped(
    cfg: Config, options: RequestOptions, per_position: bool, seed: int
) -> tuple[float, int, float]:
    """(p-value, df, TV) of SSD rounds with shaped verify logits against the exact law."""
    verify_fn = ShapedVerify(options, N_SAMPLES, per_position)
    samples = run_ssd(cfg, verify_fn, seed=seed)
    assert torch.equal(samples, verify_fn.out), "output mirror out of step"
    return chi_square(samples, shaped_ar_law(cfg, options))


@pytest.mark.parametrize("name", list(SHAPING))
def test_shaped_ssd_rounds_match_penalized_law(name: str) -> None:
    """Per-position shaping before `verify` reproduces plain decoding of the penalized target:
    the chi-square test passes and the power bound resolves TV 0.01 at the measured df."""
    cfg, options = SHAPING[name]
    seed = 10 + list(SHAPING).index(name)
    pvalue, df, tv = run_shaped(cfg, options, per_position=True, seed=seed)
    assert pvalue > SIGNIFICANCE, f"{name}: p = {pvalue:.2e}, df = {df}, TV = {tv:.4f}"
    assert min_power(df) >= 0.99, f"{name}: power {min_power(df):.3f} at df {df}"


def test_relaxed_per_round_penalties_are_rejected() -> None:
    """Negative control: SGLang's relaxed form (the round's starting counts at every position)
    fails the same test at frequency_penalty 1.5, at a TV >= 2x the test's 90%-power TV."""
    cfg, options = SHAPING["frequency_penalty"]
    pvalue, df, tv = run_shaped(cfg, options, per_position=False, seed=20)
    threshold = tv_at_power(df)
    detail = f"p = {pvalue:.2e}, df = {df}, TV = {tv:.4f}, 90%-power TV = {threshold:.4f}"
    assert pvalue < SIGNIFICANCE, f"relaxed penalties passed: {detail}"
    assert tv >= RELAXED_MARGIN * threshold, f"relaxed TV below the margin: {detail}"


def test_reference_laws_are_penalized() -> None:
    """The enumeration matches the lossless module's `ar_law` with neutral options, each
    shaped law is far (>= 2x the 90%-power TV) from the unshaped one, and min_new_tokens
    makes the stop id impossible in the first two tokens."""
    for name, (cfg, options) in SHAPING.items():
        plain = ar_law(cfg)
        neutral = shaped_ar_law(cfg, RequestOptions(()))
        assert torch.allclose(neutral, plain, rtol=0, atol=1e-12), name
        shaped = shaped_ar_law(cfg, options)
        assert abs(shaped.sum().item() - 1.0) < 1e-9, name
        tv = 0.5 * (shaped - plain).abs().sum().item()
        assert tv >= RELAXED_MARGIN * tv_at_power(V**N_TOKENS - 1), f"{name}: TV {tv:.4f}"
    cfg, options = SHAPING["presence_repetition_min_new_tokens"]
    cells = shaped_ar_law(cfg, options).view(V, V, V)
    assert cells[STOP_ID].sum() == 0 and cells[:, STOP_ID].sum() == 0
    assert cells[:, :, STOP_ID].sum() > 0

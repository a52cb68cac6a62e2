"""Losslessness of `verify` over several SSD rounds (docs/design.md#exactness-rules).

A toy decoder (vocabulary V = 5) whose target and draft logits depend on the position and on the
whole prefix (through a state that is injective on the prefixes that matter) runs SSD rounds: the
draft proposes D tokens, `verify` accepts a prefix and a bonus, the next round starts from what was
emitted. The joint law of the first 3 emitted tokens (125 cells) is compared with the exactly
enumerated autoregressive law of the target by Pearson's chi-square test.

Power statement: N = 300,000 samples per configuration, cells with expected count < 10 pooled
into one, significance 1e-3. Any alternative at total-variation distance delta >= 0.01 from the
target on these cells has noncentrality lambda = N * sum (p1 - p0)^2 / p0 >= 4 N delta^2 = 120
(Cauchy-Schwarz), so it is rejected with probability >= ncx2.sf(chi2.ppf(1 - 1e-3, df), df, 120)
>= 0.99 for df <= 124 (0.996 at df = 124); `test_power_resolves_tv_0_01` checks this for each
configuration's actual df. Each broken verifier below must be rejected by the same statistic.
Seeds are fixed, so the outcome is deterministic for a given torch build.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch
from scipy import stats

from sglang_ssd.saguaro import SamplingBatch, VerifyResult, apply_sampling, saguaro_probs, verify

V = 5
N_TOKENS = 3
N_SAMPLES = 300_000
SIGNIFICANCE = 1e-3
TV_RESOLVED = 0.01
MIN_EXPECTED = 10.0
STATES = 101
MAX_POS = N_TOKENS + 4

_tables = torch.Generator().manual_seed(2603_03251)
TARGET = (1.2 * torch.randn(MAX_POS, STATES, V, generator=_tables)).float()
DRAFT = (TARGET + torch.randn(MAX_POS, STATES, V, generator=_tables)).float()


def next_state(state: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Injective on prefixes of length <= 2 (states 0, 1..5, 8..40), so p depends on them all."""
    return (state * 7 + token + 1) % STATES


@dataclass(frozen=True)
class Config:
    name: str
    depth: int
    draft: str  # sampled | saguaro | target | greedy_backup | random | mixed
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    beta: float = 1.0
    top_m: tuple[int, ...] = ()
    unscaled_q_in_verify: bool = False  # a broken harness: verify gets q before Saguaro scaling
    draft_temperature: float | None = None  # None: the draft uses the target's parameters

    def sampling(self, batch: int) -> SamplingBatch:
        return SamplingBatch.uniform(batch, self.temperature, self.top_k, self.top_p)

    def draft_sampling(self, batch: int) -> SamplingBatch:
        if self.draft_temperature is None:
            return self.sampling(batch)
        return SamplingBatch.uniform(batch, self.draft_temperature)


CONFIGS = {
    c.name: c
    for c in [
        Config("sampled_q", depth=3, draft="sampled"),
        Config("saguaro_q", depth=3, draft="saguaro", beta=0.2, top_m=(3, 2, 2)),
        Config("point_mass_greedy_backup", depth=2, draft="greedy_backup"),
        Config("point_mass_random_no_q", depth=2, draft="random"),
        Config("mixed_point_mass_and_q", depth=3, draft="mixed", temperature=0.8),
        Config("all_accepted_bonus", depth=2, draft="target"),
        Config("top_k_top_p", depth=3, draft="sampled", temperature=0.8, top_k=4, top_p=0.8),
        Config("depth_0", depth=0, draft="sampled", temperature=1.3),
    ]
}


def _draft_step(
    cfg: Config,
    j: int,
    pos: torch.Tensor,
    state: torch.Tensor,
    point_mass: torch.Tensor,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One draft token per row: (tokens [n], the q passed to verify [n, V] or None)."""
    n = state.shape[0]
    greedy_tokens = DRAFT[pos, state].argmax(dim=1)
    if cfg.draft == "greedy_backup":
        return greedy_tokens, None
    if cfg.draft == "random":
        return torch.randint(V, (n,), generator=gen), None
    sampled_q, verify_q = _draft_tables(cfg)
    q = sampled_q[j, pos, state]
    tokens = sample(q, gen)
    # Point-mass rows (mixed batches) propose the draft's argmax; verify must ignore their q.
    tokens = torch.where(point_mass, greedy_tokens, tokens)
    return tokens, verify_q[j, pos, state]


@functools.cache
def _draft_tables(cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """q for every (depth j, position, state), computed once: [depth, MAX_POS, STATES, V] x 2.

    Row-wise the same call as drafting one row at a time (the functions are per-row), only
    faster: (the q tokens are sampled from, the q passed to verify).
    """
    rows = MAX_POS * STATES
    sampling = cfg.draft_sampling(rows)
    logits = (TARGET if cfg.draft == "target" else DRAFT).reshape(rows, V)
    plain = apply_sampling(logits, sampling)
    sampled, passed = [], []
    for j in range(max(cfg.depth, 1)):
        q = plain
        if cfg.draft == "saguaro":
            q = saguaro_probs(logits, cfg.top_m[j], cfg.beta, sampling)
        sampled.append(q)
        passed.append(plain if cfg.unscaled_q_in_verify else q)
    shape = (-1, MAX_POS, STATES, V)
    return torch.stack(sampled).reshape(shape), torch.stack(passed).reshape(shape)


def sample(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row of probs [n, V] by inverse CDF (faster than multinomial here)."""
    cdf = probs.double().cumsum(dim=1)
    u = torch.rand(probs.shape[0], 1, generator=gen, dtype=torch.float64) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=V - 1)


def run_ssd(cfg: Config, verify_fn, n: int = N_SAMPLES, seed: int = 0) -> torch.Tensor:
    """Decode the first N_TOKENS tokens of n requests by SSD rounds; int64 [n, N_TOKENS]."""
    draft_gen = torch.Generator().manual_seed(1000 + seed)
    target_gen = torch.Generator().manual_seed(2000 + seed)
    out = torch.full((n, N_TOKENS), -1, dtype=torch.int64)
    count = torch.zeros(n, dtype=torch.int64)
    state = torch.zeros(n, dtype=torch.int64)
    while bool((count < N_TOKENS).any()):
        rows = (count < N_TOKENS).nonzero().squeeze(1)
        m = rows.shape[0]
        pos, s = count[rows], state[rows]
        point_mass = rows % 2 == 1 if cfg.draft == "mixed" else torch.zeros(m, dtype=torch.bool)
        states, tokens, q_verify = [s], [], []
        for j in range(cfg.depth):
            x, qv = _draft_step(cfg, j, pos + j, states[-1], point_mass, draft_gen)
            tokens.append(x)
            q_verify.append(qv)
            states.append(next_state(states[-1], x))
        target_logits = torch.stack([TARGET[pos + j, st] for j, st in enumerate(states)], dim=1)
        draft_tokens = (
            torch.stack(tokens, dim=1) if tokens else torch.zeros(m, 0, dtype=torch.int64)
        )
        has_q = cfg.depth > 0 and q_verify[0] is not None
        draft_probs = torch.stack(q_verify, dim=1) if has_q else None
        if cfg.depth == 0:
            draft_probs = torch.zeros(m, 0, V)
        result = verify_fn(
            target_logits, draft_tokens, draft_probs, cfg.sampling(m), point_mass, target_gen
        )
        _record(out, count, state, rows, result)
    return out


def _record(out, count, state, rows, result: VerifyResult) -> None:
    k = result.accept_len
    c, s = count[rows], state[rows]
    for j in range(result.emitted.shape[1]):
        token = result.emitted[:, j]
        valid = j <= k
        col = c + j
        write = valid & (col < N_TOKENS)
        out[rows[write], col[write]] = token[write]
        s = torch.where(valid, next_state(s, token.clamp(min=0)), s)
    count[rows] = c + k + 1
    state[rows] = s


def ar_law(cfg: Config) -> torch.Tensor:
    """Exact autoregressive law of the first N_TOKENS target tokens: float64 [V ** N_TOKENS]."""
    probs = torch.ones(1, dtype=torch.float64)
    state = torch.zeros(1, dtype=torch.int64)
    for pos in range(N_TOKENS):
        p = apply_sampling(TARGET[pos, state], cfg.sampling(state.shape[0])).double()
        p = p / p.sum(dim=1, keepdim=True)
        probs = (probs.unsqueeze(1) * p).reshape(-1)
        tokens = torch.arange(V).repeat(state.shape[0])
        state = next_state(state.repeat_interleave(V), tokens)
    return probs


def chi_square(samples: torch.Tensor, law: torch.Tensor) -> tuple[float, int, float]:
    """(p-value, degrees of freedom, TV) of samples [n, N_TOKENS] against `law`."""
    n = samples.shape[0]
    assert bool((samples >= 0).all()), "some request emitted fewer tokens than needed"
    cells = sum(samples[:, i] * V ** (N_TOKENS - 1 - i) for i in range(N_TOKENS))
    counts = torch.bincount(cells, minlength=V**N_TOKENS).double()
    impossible = law == 0
    assert counts[impossible].sum() == 0, "a zero-probability sequence was emitted"
    expected = law * n
    big = expected >= MIN_EXPECTED
    small = ~big & ~impossible
    f_obs, f_exp = counts[big], expected[big]
    if bool(small.any()):
        f_obs = torch.cat([f_obs, counts[small].sum().view(1)])
        f_exp = torch.cat([f_exp, expected[small].sum().view(1)])
    result = stats.chisquare(f_obs.numpy(), f_exp.numpy() * (f_obs.sum() / f_exp.sum()).item())
    tv = 0.5 * (counts / n - law).abs().sum().item()
    return float(result.pvalue), f_obs.numel() - 1, tv


def min_power(df: int) -> float:
    critical = stats.chi2.ppf(1.0 - SIGNIFICANCE, df)
    return float(stats.ncx2.sf(critical, df, 4.0 * N_SAMPLES * TV_RESOLVED**2))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ssd_rounds_match_autoregressive_law(name: str) -> None:
    cfg = CONFIGS[name]
    pvalue, df, tv = chi_square(run_ssd(cfg, verify), ar_law(cfg))
    assert pvalue > SIGNIFICANCE, f"{name}: p = {pvalue:.2e}, df = {df}, TV = {tv:.4f}"


def test_power_resolves_tv_0_01() -> None:
    for name, cfg in CONFIGS.items():
        law = ar_law(cfg)
        big = law * N_SAMPLES >= MIN_EXPECTED
        pooled = bool(((law > 0) & ~big).any())
        df = int(big.sum()) + int(pooled) - 1
        assert df <= V**N_TOKENS - 1
        assert min_power(df) >= 0.99, f"{name}: power {min_power(df):.3f} at df {df}"


def test_greedy_rows_reproduce_argmax_decoding() -> None:
    for top_k, temperature in ((1, 1.0), (-1, 0.0)):
        cfg = Config(
            "greedy", 3, "sampled", temperature=temperature, top_k=top_k, draft_temperature=1.0
        )
        law = ar_law(cfg)
        assert law.max() == 1.0
        expected = law.argmax().item()
        tokens = run_ssd(cfg, verify, n=20_000)
        cells = sum(tokens[:, i] * V ** (N_TOKENS - 1 - i) for i in range(N_TOKENS))
        assert bool((cells == expected).all())


# ---- broken verifiers: each must fail the same test -------------------------------------------


def _broken_verify(accept: str = "ratio", bonus: str = "residual", bonus_row_offset: int = 0):
    """A verify with one named mistake, for rows with a sampled q (the configs used below)."""

    def broken(target_logits, draft_tokens, draft_probs, sampling, point_mass, generator):
        batch, depth = draft_tokens.shape
        p = apply_sampling(target_logits, sampling)
        rows = torch.arange(batch)
        if depth == 0:
            k = torch.zeros(batch, dtype=torch.int64)
        else:
            p_x = p[:, :depth].gather(2, draft_tokens.unsqueeze(2)).squeeze(2)
            q_x = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2)
            if accept == "argmax":  # the reference code's T > 0 bug
                ok = draft_tokens == p[:, :depth].argmax(dim=2)
            else:
                ok = torch.rand(p_x.shape, generator=generator) * q_x < p_x
            k = ok.long().cumprod(dim=1).sum(dim=1)
        p_row = p[rows, (k + bonus_row_offset).clamp(max=depth)]
        weights = p_row
        if bonus == "residual" and depth > 0:
            q_row = draft_probs[rows, k.clamp(max=depth - 1)]
            residual = (p_row - q_row).clamp(min=0)
            weights = torch.where((k < depth).unsqueeze(1), residual, p_row)
            weights = torch.where(weights.sum(1, keepdim=True) > 0, weights, p_row)
        bonus_token = torch.multinomial(weights, 1, generator=generator).squeeze(1)
        emitted = torch.full((batch, depth + 1), -1, dtype=torch.int64)
        for j in range(depth):
            emitted[:, j] = torch.where(j < k, draft_tokens[:, j], -1)
        emitted[rows, k] = bonus_token
        return VerifyResult(k, bonus_token, emitted)

    return broken


BROKEN = {
    "argmax_matching_at_T_gt_0": ("sampled_q", _broken_verify(accept="argmax", bonus="p")),
    "unscaled_q_after_saguaro_sampling": ("saguaro_q_unscaled", verify),
    "bonus_from_p_not_residual": ("sampled_q", _broken_verify(bonus="p")),
    "off_by_one_bonus_row": ("sampled_q", _broken_verify(bonus_row_offset=1)),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_verifier_is_rejected(name: str) -> None:
    config_name, verify_fn = BROKEN[name]
    cfg = CONFIGS.get(config_name)
    if cfg is None:  # the broken harness: sample from Saguaro's sigma, verify with plain q
        base = CONFIGS["saguaro_q"]
        cfg = Config(
            config_name,
            base.depth,
            base.draft,
            beta=base.beta,
            top_m=base.top_m,
            unscaled_q_in_verify=True,
        )
    pvalue, df, tv = chi_square(run_ssd(cfg, verify_fn, seed=1), ar_law(cfg))
    assert pvalue < SIGNIFICANCE, f"{name} passed: p = {pvalue:.2e}, df = {df}, TV = {tv:.4f}"


def test_reference_harness_accepts_the_correct_rules() -> None:
    """The broken-variant harness with no mistake passes: the failures above are the mistakes."""
    cfg = CONFIGS["sampled_q"]
    pvalue, _, tv = chi_square(run_ssd(cfg, _broken_verify(), seed=2), ar_law(cfg))
    assert pvalue > SIGNIFICANCE, f"p = {pvalue:.2e}, TV = {tv:.4f}"

"""Exact sequence distributions of a tiny target, the chi-square test against them, its power.

Used by `test_ssd_distribution.py`; `python tests/integration/tiny_distribution.py` prints the
power table quoted in that module's docstring (about 15 s of CPU; pytest never runs it).

The pair. `TinySpec`'s `sharpness` alone makes a random tiny model a "repeat the last
character" model: its layers write ~0.02-scale outputs, so the residual stream is the last
token's (tied) embedding, and sharpening only puts more mass on that one token over a flat tail
of ~100 others (measured at T = 0.7: p ≈ 0.6 on one token, and after merging cells to expected
counts ≥ 5 a joint of three tokens keeps df ≈ 600–1000, too many for a few thousand samples).
So the target here is `TinySpec(seed=0, sharpness=10)` with every layer's output projections
(`o_proj`, `down_proj`) multiplied by `LAYER_GAIN`: attention and MLP then dominate the residual
stream, predictions depend on the whole context, and a handful of tokens carries most of the
mass. `TARGET_LOGIT_SCALE` (the final norm's weight) sets p's entropy. The draft is the
target's embedding and first layer only (the target's second layer is damped by
`LAST_LAYER_GAIN` so the two stay related), with its own, flatter `DRAFT_LOGIT_SCALE`: the
draft puts ~0.4–0.8 on the target's mode and spreads the rest, so Σ min(p, q) ≈ 0.5 and
drafts are rejected about half the time.

The reference. `enumerate_cells` walks the tree of continuations with transformers in float32
(softmax in float64) under SGLang's sampling at default top-k/top-p: p = softmax(logits / T).
A prefix whose probability falls below `prune` becomes one cell holding all its continuations
(its probability is still exact), so the cells partition all sequences of `n` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from sglang_ssd.testing import TinySpec, make_tiny_model

TEMPERATURE = 0.7
SHARPNESS = 10.0
LAYER_GAIN = 30.0
LAST_LAYER_GAIN = 0.7
TARGET_LOGIT_SCALE = 1.4
DRAFT_LOGIT_SCALE = 0.5
# Two prompts (token ids of the character tokenizer) picked from random ones for spread: at
# T = 0.7 the first token's top-4 probabilities are (.37 .23 .20 .12) and (.46 .22 .19 .08).
PROMPTS: tuple[tuple[int, ...], ...] = (
    (82, 73, 83, 23, 78, 27, 4, 90, 53, 34),
    (12, 9, 10, 33, 54, 33, 5, 71, 51, 69),
)
ALPHA = 1e-3
MIN_EXPECTED = 5.0
PRUNE = 1e-6

Conditionals = Callable[[list[list[int]]], dict[str, np.ndarray]]


# ------------------------------------------------------------------------------ the tiny pair
def build_pair(root: Path) -> tuple[Path, Path]:
    """Write the target and draft described in the module docstring; returns their folders."""
    from transformers import Qwen2ForCausalLM

    target_dir = make_tiny_model(root / "target", TinySpec(seed=0, sharpness=SHARPNESS))
    draft_dir = make_tiny_model(root / "draft", TinySpec(num_layers=1, seed=0, sharpness=SHARPNESS))
    target = Qwen2ForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    draft = Qwen2ForCausalLM.from_pretrained(draft_dir, dtype=torch.float32)
    last = len(target.model.layers) - 1
    with torch.no_grad():
        for i, layer in enumerate(target.model.layers):
            gain = LAYER_GAIN * (LAST_LAYER_GAIN if i == last else 1.0)
            layer.self_attn.o_proj.weight.mul_(gain)
            layer.mlp.down_proj.weight.mul_(gain)
        shared = {
            k: v.clone()
            for k, v in target.state_dict().items()
            if not k.startswith(f"model.layers.{last}.")
        }
        draft.load_state_dict(shared)
        target.model.norm.weight.mul_(TARGET_LOGIT_SCALE)
        draft.model.norm.weight.mul_(DRAFT_LOGIT_SCALE)
    target.save_pretrained(target_dir)
    draft.save_pretrained(draft_dir)
    return target_dir, draft_dir


def load(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def next_token_logits(model: torch.nn.Module, contexts: list[list[int]]) -> torch.Tensor:
    """float64 [len(contexts), V]: the model's last-position logits; contexts of equal length."""
    out = []
    for i in range(0, len(contexts), 2048):
        ids = torch.tensor(contexts[i : i + 2048])
        out.append(model(ids, logits_to_keep=1).logits[:, -1].double())
    return torch.cat(out)


# Broken verifiers for the negative control and the power table: name -> (rule, share of tokens
# the rule decides; the rest are verified exactly). Rules: ``bonus_from_p`` draws the bonus
# from p instead of norm(max(p − q, 0)); ``q_at_t1`` verifies with the draft's q at T = 1 while
# the draft sampled at T (DESIGN.md §1 rule (a) broken).
BROKEN: dict[str, tuple[str, float]] = {
    "bonus_from_p": ("bonus_from_p", 1.0),
    "q_at_t1": ("q_at_t1", 1.0),
    "q_at_t1_one_in_five": ("q_at_t1", 0.2),
}


def model_conditionals(target: torch.nn.Module, draft: torch.nn.Module) -> Conditionals:
    """p for `enumerate_cells`, plus the law of each `BROKEN` verifier.

    A broken law describes every token as decided by one draft token (γ = 1 rounds), which is
    what `speculative_samples` does: bias families for the power table, not models of how SSD
    could fail.
    """

    def conditionals(contexts: list[list[int]]) -> dict[str, np.ndarray]:
        z_p = next_token_logits(target, contexts)
        z_q = next_token_logits(draft, contexts)
        p = torch.softmax(z_p / TEMPERATURE, -1)
        q = torch.softmax(z_q / TEMPERATURE, -1)
        rules = {
            "bonus_from_p": _verified_law(p, q, q, bonus_from_p=True),
            "q_at_t1": _verified_law(p, q, torch.softmax(z_q, -1)),
        }
        laws = {"target": p.numpy()}
        for name, (rule, share) in BROKEN.items():
            laws[name] = ((1 - share) * p + share * rules[rule]).numpy()
        return laws

    return conditionals


def _verified_law(
    p: torch.Tensor, q_sampled: torch.Tensor, q_verify: torch.Tensor, bonus_from_p: bool = False
) -> torch.Tensor:
    """Law of the emitted token: draft x ~ q_sampled, accept w.p. min(1, p/q_verify)."""
    accept = torch.minimum(torch.ones_like(p), p / q_verify.clamp_min(1e-300))
    accepted = q_sampled * accept
    residual = p if bonus_from_p else (p - q_verify).clamp_min(0)
    residual = residual / residual.sum(-1, keepdim=True)
    return accepted + (1 - accepted.sum(-1, keepdim=True)) * residual


# ------------------------------------------------------------------------------ the reference
@dataclass
class Cells:
    """A partition of all `n`-token continuations of one prompt.

    Attributes:
        keys: per cell, a full n-token tuple, or a shorter pruned prefix (all its continuations).
        probs: per named law ("target" first), float64 [num cells], summing to 1.
    """

    keys: list[tuple[int, ...]]
    probs: dict[str, np.ndarray]
    n: int

    def __post_init__(self) -> None:
        self._index = {key: i for i, key in enumerate(self.keys)}

    def index(self, tokens: Sequence[int]) -> int:
        """The cell of one sampled continuation (its first `n` tokens)."""
        tokens = tuple(tokens[: self.n])
        for length in range(1, self.n + 1):
            cell = self._index.get(tokens[:length])
            if cell is not None:
                return cell
        raise KeyError(f"{tokens} is in no cell")

    def counts(self, samples: Sequence[Sequence[int]]) -> np.ndarray:
        counts = np.zeros(len(self.keys), dtype=np.int64)
        for tokens in samples:
            counts[self.index(tokens)] += 1
        return counts


def enumerate_cells(
    conditionals: Conditionals, prompt: Sequence[int], n: int, prune: float = PRUNE
) -> Cells:
    """Exact laws of the next `n` tokens after `prompt`, cell by cell (pruning follows p)."""
    frontier: list[tuple[int, ...]] = [()]
    weights: dict[str, np.ndarray] | None = None
    keys: list[tuple[int, ...]] = []
    probs: dict[str, list[np.ndarray]] = {}
    for depth in range(n):
        laws = conditionals([list(prompt) + list(prefix) for prefix in frontier])
        if weights is None:
            weights = {name: np.ones(1) for name in laws}
        joint = {name: weights[name][:, None] * law for name, law in laws.items()}
        vocab = joint["target"].shape[1]
        children = [(*prefix, t) for prefix in frontier for t in range(vocab)]
        flat = {name: j.reshape(-1) for name, j in joint.items()}
        stop = np.ones(len(children), dtype=bool)
        if depth < n - 1:
            stop = flat["target"] < prune
        keys += [c for c, s in zip(children, stop, strict=True) if s]
        for name, values in flat.items():
            probs.setdefault(name, []).append(values[stop])
        frontier = [c for c, s in zip(children, stop, strict=True) if not s]
        weights = {name: values[~stop] for name, values in flat.items()}
    return Cells(keys, {name: np.concatenate(v) for name, v in probs.items()}, n)


# ------------------------------------------------------------------------------ the statistic
def merge_groups(
    probs: np.ndarray, n_samples: int, min_expected: float = MIN_EXPECTED
) -> tuple[np.ndarray, int]:
    """Group index per cell, and the number of groups, so that every group expects at least
    `min_expected` of `n_samples` samples.

    Cells are pooled in increasing order of probability until the pool reaches the threshold
    (cells above it stand alone): a rule fixed by the reference alone, before any data. A last
    pool still short joins the group before it.
    """
    expected = probs * n_samples
    groups = np.empty(len(probs), dtype=np.int64)
    group, pooled = 0, 0.0
    for cell in np.argsort(expected, kind="stable"):
        groups[cell] = group
        pooled += expected[cell]
        if pooled >= min_expected:
            group, pooled = group + 1, 0.0
    if pooled > 0:  # a short last pool (only if the largest cell is below the threshold)
        if group == 0:
            return np.zeros(len(probs), dtype=np.int64), 1
        groups[groups == group] = group - 1
        return groups, group
    return groups, group


@dataclass(frozen=True)
class ChiSquareResult:
    """Pearson's χ² statistic, its degrees of freedom and p-value, and the sample count."""

    statistic: float
    df: int
    p_value: float
    samples: int

    @property
    def rejects(self) -> bool:
        return self.p_value < ALPHA


def chi_square(counts: Sequence[np.ndarray], refs: Sequence[np.ndarray]) -> ChiSquareResult:
    """Pearson's χ² of observed cell counts against reference laws, summed over prompts.

    Each prompt's cells are merged so that every group expects ≥ 5 samples; each prompt's
    sample count is fixed by design, so df = Σ (groups − 1).
    """
    statistic, df, total = 0.0, 0, 0
    for observed, ref in zip(counts, refs, strict=True):
        n = int(observed.sum())
        groups, k = merge_groups(ref, n)
        o = np.bincount(groups, weights=observed, minlength=k)
        e = np.bincount(groups, weights=ref, minlength=k) * n
        statistic += float(((o - e) ** 2 / e).sum())
        df += k - 1
        total += n
    return ChiSquareResult(statistic, df, float(stats.chi2.sf(statistic, df)), total)


# ------------------------------------------------------------------------------ a biased sampler
@torch.no_grad()
def speculative_samples(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompt: Sequence[int],
    n: int,
    samples: int,
    bug: str | None,
    generator: torch.Generator,
) -> list[tuple[int, ...]]:
    """`samples` continuations of `n` tokens, each token drafted once from q and verified.

    bug: None (exact speculative sampling) or a `BROKEN` verifier's name.
    """
    rule, share = BROKEN[bug] if bug is not None else (None, 0.0)
    seqs = torch.empty(samples, 0, dtype=torch.int64)
    for depth in range(n):
        if depth == 0:
            prefixes, inverse = seqs[:1], torch.zeros(samples, dtype=torch.int64)
        else:
            prefixes, inverse = torch.unique(seqs, dim=0, return_inverse=True)
        contexts = [list(prompt) + row.tolist() for row in prefixes]
        z_p = next_token_logits(target, contexts)[inverse]
        z_q = next_token_logits(draft, contexts)[inverse]
        p = torch.softmax(z_p / TEMPERATURE, -1)
        q = torch.softmax(z_q / TEMPERATURE, -1)
        broken = torch.rand(samples, 1, generator=generator, dtype=torch.float64) < share
        q_verify = torch.where(broken, torch.softmax(z_q, -1), q) if rule == "q_at_t1" else q
        x = torch.multinomial(q, 1, generator=generator)
        ratio = p.gather(1, x) / q_verify.gather(1, x)
        accept = torch.rand(samples, 1, generator=generator, dtype=torch.float64) < ratio
        residual = (p - q_verify).clamp_min(0)
        if rule == "bonus_from_p":
            residual = torch.where(broken, p, residual)
        bonus = torch.multinomial(residual, 1, generator=generator)
        seqs = torch.cat([seqs, torch.where(accept, x, bonus)], dim=1)
    return [tuple(row) for row in seqs.tolist()]


# ------------------------------------------------------------------------------ power
def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def rejection_rate(
    laws: Sequence[np.ndarray], refs: Sequence[np.ndarray], n: int, reps: int, seed: int
) -> float:
    """Fraction of `reps` simulated runs (`n` samples per prompt from `laws`) the test rejects."""
    rng = np.random.default_rng(seed)
    statistic = np.zeros(reps)
    df = 0
    for law, ref in zip(laws, refs, strict=True):
        groups, k = _merged(ref, n)
        expected = np.bincount(groups, weights=ref, minlength=k) * n
        law_g = np.bincount(groups, weights=law, minlength=k)
        draws = rng.multinomial(n, law_g / law_g.sum(), size=reps)
        statistic += ((draws - expected) ** 2 / expected).sum(axis=1)
        df += k - 1
    return float((stats.chi2.sf(statistic, df) < ALPHA).mean())


_MERGED: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}


def _merged(ref: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """`merge_groups`, memoised per reference array (the power search reuses a few)."""
    key = (id(ref), n)
    if key not in _MERGED or _MERGED[key][0] is not ref:
        _MERGED[key] = (ref, *merge_groups(ref, n))
    return _MERGED[key][1], _MERGED[key][2]


def mode_law(ref: np.ndarray) -> np.ndarray:
    """All mass on the most likely sequence (a sampler skewed toward argmax)."""
    law = np.zeros_like(ref)
    law[np.argmax(ref)] = 1.0
    return law


def half_law(ref: np.ndarray) -> np.ndarray:
    """p restricted to its most likely cells holding about half the mass, renormalised.

    Mixing toward it scales one half of the distribution up and the other down in proportion:
    for Pearson's χ² the direction with the least noncentrality per unit of total variation
    (λ = N·TV² / (P(A)·P(B)) ≥ 4·N·TV²), i.e. the hardest bias to see.
    """
    order = np.argsort(ref)[::-1]
    cumulative = np.cumsum(ref[order])
    size = int(np.argmin(np.abs(cumulative - 0.5))) + 1
    law = np.zeros_like(ref)
    law[order[:size]] = ref[order[:size]]
    return law / law.sum()


def pooled_mass(ref: np.ndarray, n: int) -> float:
    """Probability in cells merged with others (a bias confined to one pool is invisible)."""
    groups, k = merge_groups(ref, n)
    sizes = np.bincount(groups, minlength=k)
    return float(ref[sizes[groups] > 1].sum())


def min_detectable_tv(
    refs: Sequence[np.ndarray],
    alternatives: Sequence[np.ndarray],
    n: int,
    reps: int = 2000,
    power: float = 0.9,
) -> float:
    """Smallest TV of (1 − ε)·ref + ε·alternative (per prompt, averaged) rejected with prob ≥
    `power` at `n` samples per prompt, by bisection on ε over simulated runs."""
    lo, hi = 0.0, 1.0
    for step in range(12):
        eps = (lo + hi) / 2
        laws = [(1 - eps) * r + eps * a for r, a in zip(refs, alternatives, strict=True)]
        if rejection_rate(laws, refs, n, reps, seed=step) >= power:
            hi = eps
        else:
            lo = eps
    tvs = [total_variation(r, a) for r, a in zip(refs, alternatives, strict=True)]
    return hi * float(np.mean(tvs))


def power_table(root: Path, n_tokens: int, sizes: Sequence[int]) -> None:
    """Print, per samples-per-prompt, the smallest TV each bias family is detected at (90%)."""
    build_pair(root)
    target, draft = load(root / "target"), load(root / "draft")
    cells = [enumerate_cells(model_conditionals(target, draft), p, n_tokens) for p in PROMPTS]
    refs = [c.probs["target"] for c in cells]
    families = {
        "hardest": [half_law(r) for r in refs],
        "toward the mode": [mode_law(r) for r in refs],
        "bonus from p": [c.probs["bonus_from_p"] for c in cells],
        "q at T=1 in verify": [c.probs["q_at_t1"] for c in cells],
    }
    for n in sizes:
        dfs = [merge_groups(r, n)[1] - 1 for r in refs]
        pooled = [round(pooled_mass(r, n), 4) for r in refs]
        row = {k: min_detectable_tv(refs, alt, n) for k, alt in families.items()}
        print(
            f"n={n}/prompt df={dfs} pooled mass={pooled}: "
            + ", ".join(f"{k}: {v:.3f}" for k, v in row.items())
        )
    for name in BROKEN:
        tvs = [total_variation(c.probs["target"], c.probs[name]) for c in cells]
        laws = [c.probs[name] for c in cells]
        rates = [rejection_rate(laws, refs, n, 2000, seed=0) for n in sizes]
        tv = np.round(tvs, 3).tolist()
        print(f"{name}: TV per prompt {tv}, rejection rate at {list(sizes)}: {rates}")


if __name__ == "__main__":
    import sys
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        n_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 4
        sizes = [int(s) for s in sys.argv[2:]] or [1024, 2048, 4096]
        power_table(Path(tmp), n_tokens, sizes)

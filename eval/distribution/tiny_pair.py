"""The sharp tiny pair of the distribution check, and samplers with a broken verify rule.

`TinySpec`'s `sharpness` alone makes a random tiny model a "repeat the last character" model: its
layers write ~0.02-scale outputs, so the residual stream is the last token's (tied) embedding,
and sharpening only puts more mass on that one token over a flat tail of ~100 others (measured
at T = 0.7: p ≈ 0.6 on one token, and after merging cells to expected counts ≥ 5 a joint of
three tokens keeps df ≈ 600–1000, too many for a few thousand samples). So the target here is
`TinySpec(seed=0, sharpness=10)` with every layer's output projections (`o_proj`, `down_proj`)
multiplied by `LAYER_GAIN`: attention and MLP then dominate the residual stream, predictions
depend on the whole context, and a handful of tokens carries most of the mass.
`TARGET_LOGIT_SCALE` (the final norm's weight) sets p's entropy. The draft is the target's
embedding and first layer only (the target's second layer is damped by `LAST_LAYER_GAIN` so the
two stay related), with its own, flatter `DRAFT_LOGIT_SCALE`: the draft puts ~0.4–0.8 on the
target's mode and spreads the rest, so Σ min(p, q) ≈ 0.5 and drafts are rejected about half the
time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from eval.distribution.reference import Cells, Conditionals, enumerate_cells
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


@dataclass
class Pair:
    """The pair on disk and in memory, and the exact reference cells of each of `PROMPTS`."""

    target_dir: Path
    draft_dir: Path
    target: torch.nn.Module
    draft: torch.nn.Module
    cells: list[Cells]


def prepare_pair(root: Path, n_tokens: int) -> Pair:
    """Build the pair under `root` and enumerate each prompt's next `n_tokens` (p and every
    `BROKEN` law); about 10 s of one CPU."""
    target_dir, draft_dir = build_pair(root)
    target, draft = load(target_dir), load(draft_dir)
    conditionals = model_conditionals(target, draft)
    cells = [enumerate_cells(conditionals, prompt, n_tokens) for prompt in PROMPTS]
    return Pair(target_dir, draft_dir, target, draft, cells)


def load(path: Path) -> torch.nn.Module:
    """A model folder as a float32 transformers model in eval mode."""
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
# the draft sampled at T (docs/design.md#sampled-drafts rule (a) broken).
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

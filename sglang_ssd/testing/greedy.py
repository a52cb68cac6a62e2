"""Greedy-equality checks with the numerics rule of DESIGN.md §1.

Greedy outputs must match token for token. The only allowed exception is a position where the
target's top-2 logit margin, recomputed in fp32 on the common prefix, is below ε: there bf16
rounding that depends on batch shape may legitimately flip the argmax. After such a position the
sequences diverge, so comparison stops there.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

# Logit units; bf16 rounding of Qwen2.5-1.5B's logits is a few hundredths to ~0.1.
DEFAULT_MARGIN_EPS = 0.25


@dataclass(frozen=True)
class Divergence:
    """The first position where two greedy outputs differ, and the target's fp32 margin there."""

    index: int
    expected: int
    got: int
    margin: float | None = None


def first_divergence(expected: Sequence[int], got: Sequence[int]) -> Divergence | None:
    """The first index where the outputs differ (a length difference counts); None if equal."""
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return Divergence(i, int(a), int(b))
    if len(expected) != len(got):
        i = min(len(expected), len(got))
        longer = expected if len(expected) > len(got) else got
        return Divergence(
            i, int(longer[i]) if longer is expected else -1, int(longer[i]) if longer is got else -1
        )
    return None


def fp32_top2_margins(model_dir: str | Path, prefixes: Sequence[Sequence[int]]) -> list[float]:
    """The target's fp32 top-2 logit margin after each prefix (loads and frees the model)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    margins = []
    with torch.inference_mode():
        for prefix in prefixes:
            logits = model(torch.tensor([list(prefix)])).logits[0, -1]
            top = torch.topk(logits, 2).values
            margins.append(float(top[0] - top[1]))
    del model
    gc.collect()
    return margins


def check_greedy(
    model_dir: str | Path,
    prompts: Sequence[Sequence[int]],
    expected: Sequence[Sequence[int]],
    got: Sequence[Sequence[int]],
    eps: float = DEFAULT_MARGIN_EPS,
) -> tuple[list[Divergence | None], list[str]]:
    """Compare greedy outputs per prompt under the ε rule.

    Returns:
        (the divergence per prompt with its fp32 margin, or None; the violations: divergences
        whose margin is ≥ ε, as readable strings). Empty violations means the check passed.
    """
    found = [first_divergence(e, g) for e, g in zip(expected, got, strict=True)]
    todo = [(i, d) for i, d in enumerate(found) if d is not None]
    margins = (
        fp32_top2_margins(
            model_dir, [list(prompts[i]) + list(expected[i][: d.index]) for i, d in todo]
        )
        if todo
        else []
    )
    violations = []
    for (i, d), margin in zip(todo, margins, strict=True):
        found[i] = Divergence(d.index, d.expected, d.got, margin)
        if margin >= eps:
            violations.append(
                f"prompt {i}: token {d.index} expected {d.expected} got {d.got}, "
                f"fp32 top-2 margin {margin:.3f} >= eps {eps}"
            )
    return found, violations

"""How well a head drafts for its target, measured offline (no server): top-1 agreement and the
greedy chain's accept length.

Both run the head as it drafts (`ttt.Unroll`, the layout training uses), but with the head's
own argmax tokens instead of the text's from step 1 on:

- top-1 agreement: the fraction of positions where the head's first draft (real features, the
  text's token) is the target's argmax;
- accept length on a target-greedy text (prompt + the target's own greedy continuation): after
  each committed prefix inside the continuation, the target's greedy continuation is the text
  itself, so a chain of γ drafts is accepted up to its first token that differs from the text,
  plus the bonus token: accept length = 1 + that count, ∈ [1, γ + 1] (SD's accept length,
  Leviathan et al. 2023, at greedy).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang_ssd.build.target_pass import target_pass
from sglang_ssd.build.ttt import Unroll
from sglang_ssd.config import DEFAULT_LOOKAHEAD
from sglang_ssd.eagle3.head import Eagle3Head


@torch.no_grad()
def chain_drafts(
    head: Eagle3Head, input_ids: torch.Tensor, features: torch.Tensor, gamma: int
) -> torch.Tensor:
    """The head's greedy chain of `gamma` drafts after every prefix, in parallel.

    Args:
        head: the head (target attached).
        input_ids: int64 [B, T].
        features: [B, T, n × target_hidden], the target's features of `input_ids`.
        gamma: drafts per chain, ≥ 1.

    Returns:
        int64 [B, T − 1, gamma], target ids: row t is the chain drafted after the prefix
        x_0..x_{t+1} (its first entry should be x_{t+2}).

    Raises:
        ValueError: `gamma` < 1 or T < 2.
    """
    if gamma < 1 or input_ids.shape[1] < 2:
        raise ValueError(f"need gamma >= 1 and T >= 2: gamma {gamma}, T {input_ids.shape[1]}")
    columns = head.target_token_ids()
    unroll = Unroll(head, features, input_ids.shape[1] - 1)
    tokens, drafts = input_ids[:, 1:], []
    for _ in range(gamma):
        tokens = columns[unroll.step(tokens).logits.argmax(-1)]
        drafts.append(tokens)
    return torch.stack(drafts, dim=-1)


@torch.no_grad()
def top1_agreement(
    head: Eagle3Head,
    target: torch.nn.Module,
    sequences: Sequence[torch.Tensor],
    aux_layer_ids: Sequence[int] | None,
) -> float:
    """The fraction of positions (over every sequence, int64 [T] each) where the head's first
    draft equals the target's argmax next token."""
    hits = total = 0
    for ids in sequences:
        features, logits = target_pass(target, ids[None], aux_layer_ids)
        first = chain_drafts(head, ids[None], features, 1)[0, :, 0]
        want = logits[0, 1:].argmax(-1)  # row t's draft should be the argmax after x_{t+1}
        hits += int((first == want).sum())
        total += want.numel()
    return hits / max(total, 1)


@torch.no_grad()
def greedy_accept_length(
    head: Eagle3Head,
    target: torch.nn.Module,
    texts: Sequence[tuple[torch.Tensor, int]],
    aux_layer_ids: Sequence[int] | None,
    gamma: int = DEFAULT_LOOKAHEAD,
) -> float:
    """Mean greedy accept length of γ-chains over target-greedy texts.

    Args:
        head: the head (target attached).
        target: the transformers target whose greedy output the texts continue.
        texts: (int64 [T] ids, P) pairs: a prompt of P tokens followed by the target's own greedy
            continuation (P ≥ 1); chains are scored after every prefix that ends inside the
            continuation and leaves γ tokens of it to compare.
        aux_layer_ids: the head's target layers (`Eagle3Config.aux_layer_ids`).
        gamma: γ, drafts per chain.

    Returns:
        The mean of 1 + (leading drafts equal to the text) over scored prefixes; 1.0 if none.

    Raises:
        ValueError: `gamma` < 1 (from `chain_drafts`).
    """
    lengths: list[int] = []
    for ids, prompt_len in texts:
        features, _ = target_pass(target, ids[None], aux_layer_ids)
        drafts = chain_drafts(head, ids[None], features, gamma)[0]
        # Row r follows the prefix x_0..x_{r+1}; its drafts are compared with x_{r+2}...
        for r in range(max(prompt_len - 2, 0), ids.numel() - 2 - gamma + 1):
            want = ids[r + 2 : r + 2 + gamma]
            match = (drafts[r] == want).int().cumprod(0).sum()
            lengths.append(1 + int(match))
    return sum(lengths) / len(lengths) if lengths else 1.0

"""EAGLE-3's training-time test: the head unrolled over K draft steps, as it runs when drafting.

Source: EAGLE-3 (Li et al. 2025, §3.2 "training-time test"); the alignment is SGLang's
(`llama_eagle3.py` draft extend: the feature of position t is paired with token t + 1 at RoPE
position t).

A sequence x_0..x_{T-1} gives target features f_t (`features.target_features`) and target
logits L_t (L_t is the target's distribution of x_{t+1}). With N = T − K rows t = 0..N−1:

- step 0: row t reads (token x_{t+1}, feature f_t) at position t and must predict L_{t+1};
- step j ≥ 1: row t reads (token x_{t+1+j}, the head's own step j−1 hidden of row t) at position
  t + j and must predict L_{t+1+j}.

Row t of step j attends to the step-0 keys of rows 0..t (the context drafted from real
features) and to its own keys of steps 1..j (the chain it drafted): a causal block followed by
diagonal blocks. That is what the head sees at inference, where the draft of step j comes after
a context with real features and j − 1 tokens of its own, so training sees its own errors.

The loss of step j is the cross-entropy of the head against the target's distribution over the
draft vocabulary (the target's probabilities on the kept ids, renormalised), weighted
`STEP_DECAY`**j.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sglang_ssd.eagle3.head import Eagle3Head, HeadOutput, KVCache

STEP_DECAY = 0.8


@dataclass(frozen=True)
class TTTResult:
    """One unrolled pass.

    Attributes:
        loss: scalar, differentiable: Σ_j STEP_DECAY**j · CE_j / Σ_j STEP_DECAY**j.
        step_losses: float [K], CE_j (detached).
        step_agreement: float [K], the fraction of rows whose head argmax (as a target id) is
            the target's argmax at step j (detached; what greedy acceptance rewards).
    """

    loss: torch.Tensor
    step_losses: torch.Tensor
    step_agreement: torch.Tensor


def ttt_mask(rows: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """bool [1, N, (step + 1)·N]: row t of `step` sees step-0 keys 0..t and its own keys of
    steps 1..step (True = attend)."""
    causal = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    eye = torch.eye(rows, dtype=torch.bool, device=device)
    return torch.cat([causal, *([eye] * step)], dim=1)[None]


class Unroll:
    """The head run step by step over the training-time-test layout (module doc): step j's
    rows sit at positions t + j, read the previous step's hidden (the target's features at
    step 0), and attend through `ttt_mask` to the step-0 keys and their own earlier steps.

    Training (`unrolled_loss`) feeds the text's tokens at every step, offline drafting
    (`evaluate.chain_drafts`) the head's own argmax; the layout is this one class.

    Args:
        head: the head (target attached).
        features: [B, ≥ rows, n × target_hidden], the target's features of the sequences.
        rows: N, the rows of every step.
    """

    def __init__(self, head: Eagle3Head, features: torch.Tensor, rows: int) -> None:
        self.head = head
        self.rows = rows
        self.hidden = features[:, :rows]
        self.positions = torch.arange(rows, device=features.device)[None].expand(
            features.shape[0], rows
        )
        self.past: KVCache | None = None
        self.step_index = 0

    def step(self, tokens: torch.Tensor) -> HeadOutput:
        """The next step over `tokens` (int64 [B, N], target ids); its output's hidden and KV
        feed the step after."""
        j = self.step_index
        mask = ttt_mask(self.rows, j, tokens.device)
        out = self.head(tokens, self.hidden, self.positions + j, past=self.past, mask=mask)
        self.past = out.kv if self.past is None else self.past.extend(out.kv)
        self.hidden = out.hidden
        self.step_index += 1
        return out


def target_on_draft_vocab(target_logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """The target's probabilities on the draft vocabulary, renormalised.

    Args:
        target_logits: float [..., V], the target's logits.
        token_ids: int64 [D], the target id of each head logit column
            (`Eagle3Head.target_token_ids`).

    Returns:
        float32 [..., D], rows summing to 1.
    """
    return torch.softmax(target_logits.float()[..., token_ids], dim=-1)


def unrolled_loss(
    head: Eagle3Head,
    input_ids: torch.Tensor,
    features: torch.Tensor,
    target_logits: torch.Tensor,
    steps: int,
) -> TTTResult:
    """The training-time-test loss of one sequence batch.

    Args:
        head: the head being trained (its target embeddings attached).
        input_ids: int64 [B, T], the sequences.
        features: [B, T, n × target_hidden], the target's features of `input_ids`.
        target_logits: [B, T, V], the target's logits of `input_ids`.
        steps: K ≥ 1, draft steps unrolled.

    Returns:
        `TTTResult`.

    Raises:
        ValueError: K < 1 or T ≤ K (no row would have a label at every step).
    """
    t = input_ids.shape[1]
    rows = t - steps
    if steps < 1 or rows < 1:
        raise ValueError(f"need 1 <= steps < T: steps {steps}, T {t}")
    columns = head.target_token_ids()
    unroll = Unroll(head, features, rows)
    weights, losses, agreement = [], [], []
    for step in range(steps):
        out = unroll.step(input_ids[:, 1 + step : 1 + step + rows])
        labels = target_logits[:, 1 + step : 1 + step + rows]
        want = target_on_draft_vocab(labels, columns)
        log_q = F.log_softmax(out.logits.float(), dim=-1)
        losses.append(-(want * log_q).sum(-1).mean())
        weights.append(STEP_DECAY**step)
        agreement.append((columns[out.logits.argmax(-1)] == labels.argmax(-1)).float().mean())
    stacked = torch.stack(losses)
    w = torch.tensor(weights, device=stacked.device)
    return TTTResult(
        loss=(stacked * w).sum() / w.sum(),
        step_losses=stacked.detach(),
        step_agreement=torch.stack(agreement).detach(),
    )

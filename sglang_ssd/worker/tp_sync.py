"""One speculator for a tensor-parallel target: TP rank 0 decides, every rank follows.

With `--tp-size N` every TP rank runs SGLang's scheduler and an `SSDWorker` over the same
batches, and the verify forward is one collective forward of all ranks: every rank needs the
same input tokens, and every rank must commit the same tokens (to its KV shard and its copy of
each request). Only TP rank 0 holds a `SpeculatorClient` (and so a speculator process). Per
decode round it broadcasts over the TP group's CPU (gloo) group, as SGLang's `eagle_sample`
broadcasts its accept results:

1. before the forward, the round's plan (`share_plan`): the mode rank 0's `RoundModePolicy`
   chose and the drafts rank 0 obtained, whether from the speculator (a hit, a just-in-time,
   n-gram or random backup) or its own n-gram drafts after a timeout or fault: so hits, misses,
   timeouts and faults are decided once;
2. after the verify, which only rank 0 runs (`saguaro.verify`, its own RNG), the outcome
   (`share_outcome`): k and t* per row, from which every rank lays out the same accept index and
   emitted tokens (`verify_step.chain_layout`).

q never crosses (only rank 0 verifies), so followers hold drafts with `q=None` and rank 0's
`has_q`. Two broadcasts per decode round, none per prefill. With one rank there is no `TpGroup`
and none of this runs.

Payloads are int64 CPU tensors whose size every rank knows from its own batch: the plan is
`plan_size(B, γ)` = 2 + B·(3 + γ) values (mode, Dmax, then per row D_r, has_q, source, and γ
tokens -1 padded); the outcome is [2, B] (k, t*).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sglang_ssd.worker.draft_batch import DraftBatch
from sglang_ssd.worker.round_mode import RoundMode
from sglang_ssd.worker.verify_step import VerifiedBatch, chain_layout

# `DraftBatch.sources` values, coded by position ("missing" never leaves the client).
SOURCES = ("cache", "jit", "ngram", "random", "local-ngram", "plain")
MODES = tuple(RoundMode)
_ROW_FIELDS = 3  # D_r, has_q, source


@dataclass(frozen=True)
class TpGroup:
    """The target's TP group as SSD uses it.

    Attributes:
        group: the group's CPU (gloo) process group (SGLang's `tp_group.cpu_group`).
        rank: this process's rank within the group; rank 0 leads.
        size: the group's size (> 1).
    """

    group: Any
    rank: int
    size: int

    @property
    def leader(self) -> bool:
        """Whether this rank drives the speculator and verifies."""
        return self.rank == 0


@dataclass(frozen=True)
class RoundPlan:
    """What a decode round does, as rank 0 decided it: its mode and its drafts."""

    mode: RoundMode
    drafts: DraftBatch


def plan_size(batch_size: int, lookahead: int) -> int:
    """Values in a packed plan of `batch_size` rows at lookahead γ = `lookahead`."""
    return 2 + batch_size * (_ROW_FIELDS + lookahead)


def pack_plan(plan: RoundPlan, lookahead: int) -> torch.Tensor:
    """The plan as one broadcastable tensor.

    Args:
        plan: the round's mode and drafts (tokens int64 [B, Dmax] -1 padded, Dmax ≤ γ).
        lookahead: γ.

    Returns:
        int64 [plan_size(B, γ)] on the CPU: [mode, Dmax, then per row D_r, has_q, source code,
        tokens padded with -1 to γ].

    Raises:
        ValueError: drafts deeper than γ, or a source not in `SOURCES`.
    """
    drafts = plan.drafts
    b, depth_max = drafts.tokens.shape
    if depth_max > lookahead:
        raise ValueError(f"drafts of depth {depth_max} exceed the lookahead {lookahead}")
    unknown = sorted(set(drafts.sources) - set(SOURCES))
    if unknown:
        raise ValueError(f"draft sources {unknown} cannot be shared with the TP group")
    tokens = torch.full((b, lookahead), -1, dtype=torch.int64)
    tokens[:, :depth_max] = drafts.tokens.cpu()
    rows = torch.cat(
        [
            drafts.depth.cpu().to(torch.int64).unsqueeze(1),
            drafts.has_q.cpu().to(torch.int64).unsqueeze(1),
            torch.tensor([SOURCES.index(s) for s in drafts.sources], dtype=torch.int64).reshape(
                b, 1
            ),
            tokens,
        ],
        dim=1,
    )
    header = torch.tensor([MODES.index(plan.mode), depth_max], dtype=torch.int64)
    return torch.cat([header, rows.reshape(-1)])


def unpack_plan(payload: torch.Tensor, batch_size: int, lookahead: int) -> RoundPlan:
    """The plan `pack_plan` packed (q is not carried: `q=None`).

    Args:
        payload: int64 [plan_size(batch_size, lookahead)].
        batch_size: B, this rank's batch size.
        lookahead: γ.

    Raises:
        ValueError: a payload of the wrong size or with out-of-range codes (ranks that
            disagree on the batch, or a corrupt broadcast).
    """
    if payload.shape != (plan_size(batch_size, lookahead),):
        raise ValueError(
            f"plan of {tuple(payload.shape)} values for a batch of {batch_size} at γ={lookahead}"
        )
    mode_code, depth_max = payload[:2].tolist()
    rows = payload[2:].reshape(batch_size, _ROW_FIELDS + lookahead)
    depth, has_q, source = rows[:, 0].clone(), rows[:, 1].bool(), rows[:, 2]
    if not 0 <= mode_code < len(MODES) or not 0 <= depth_max <= lookahead:
        raise ValueError(f"plan header (mode {mode_code}, depth {depth_max}) out of range")
    if batch_size and (
        bool((depth < 0).any() | (depth > depth_max).any())
        or bool((source < 0).any() | (source >= len(SOURCES)).any())
    ):
        raise ValueError("plan rows carry a depth or source out of range")
    drafts = DraftBatch(
        tokens=rows[:, _ROW_FIELDS : _ROW_FIELDS + depth_max].clone(),
        depth=depth,
        q=None,
        has_q=has_q,
        sources=[SOURCES[i] for i in source.tolist()],
    )
    return RoundPlan(mode=MODES[mode_code], drafts=drafts)


def share_plan(
    tp: TpGroup, batch_size: int, lookahead: int, decide: Callable[[], RoundPlan]
) -> RoundPlan:
    """The round's plan on every rank: rank 0 calls `decide` (mode, drafts: the speculator's
    or the fallback's) and broadcasts it; the other ranks never call it and return rank 0's.

    Args:
        tp: the TP group.
        batch_size: B (every rank runs the same batch).
        lookahead: γ.
        decide: rank 0's planning (`SSDWorker` asks its `SpeculatorClient`).

    Raises:
        RuntimeError: from torch.distributed when a peer is gone or the broadcast times out.
        ValueError: from `pack_plan` / `unpack_plan`.
    """
    if tp.leader:
        plan = decide()
        dist.broadcast(pack_plan(plan, lookahead), group=tp.group, group_src=0)
        return plan
    payload = torch.empty(plan_size(batch_size, lookahead), dtype=torch.int64)
    dist.broadcast(payload, group=tp.group, group_src=0)
    return unpack_plan(payload, batch_size, lookahead)


def share_outcome(
    tp: TpGroup, drafts: DraftBatch, width: int, verify: Callable[[], VerifiedBatch]
) -> VerifiedBatch:
    """The round's verified outcome on every rank: rank 0 calls `verify` and broadcasts k and
    t* per row; the other ranks lay the same out from their copy of the drafts.

    Args:
        tp: the TP group.
        drafts: the round's drafts (tokens int64 [B, Dmax] on the CPU), as `share_plan` gave.
        width: W, the verify window of the round (γ + 1; 1 in a plain round).
        verify: rank 0's verification (`verify_step.verify_batch`).

    Returns:
        The `VerifiedBatch` (accept_len and bonus int64 [B] on the CPU, SGLang's layout).

    Raises:
        RuntimeError: from torch.distributed when a peer is gone or the broadcast times out.
    """
    if tp.leader:
        verified = verify()
        outcome = torch.stack([verified.accept_len.cpu(), verified.bonus.cpu()]).to(torch.int64)
        dist.broadcast(outcome, group=tp.group, group_src=0)
        return verified
    outcome = torch.empty(2, drafts.batch_size, dtype=torch.int64)
    dist.broadcast(outcome, group=tp.group, group_src=0)
    return chain_layout(drafts.tokens, outcome[0].clone(), outcome[1].clone(), width)

"""One speculator for a tensor-parallel target: TP rank 0 decides, every rank follows.

With `--tp-size N` every TP rank runs SGLang's scheduler and an `SSDWorker` over the same
batches, and the verify forward is one collective forward of all ranks: every rank needs the
same input tokens, and every rank must commit the same tokens (to its KV shard and its copy of
each request). Only TP rank 0 holds a `SpeculatorClient` (and so a speculator process). Per
decode round it broadcasts over the TP group's CPU (gloo) group, as SGLang's `eagle_sample`
broadcasts its accept results:

1. before the forward, the round's plan (`share_plan`): the arrangement rank 0's
   `RoundPlanner` chose (decided once, for the cores of rank 0 and its speculator; the other
   ranks' cores never move) and the drafts rank 0 obtained, whether from the speculator (a hit,
   a just-in-time, n-gram or random backup) or its own n-gram drafts after a timeout or fault:
   so hits, misses, timeouts and faults are decided once;
2. after the verify, which only rank 0 runs (`saguaro.verify`, its own RNG), the outcome
   (`share_outcome`): k and t* per row, from which every rank lays out the same accept index and
   emitted tokens (`verify_step.chain_layout`).

q never crosses (only rank 0 verifies), so followers hold drafts with `q=None` and rank 0's
`has_q`. Two broadcasts per decode round, none per prefill. With one rank there is no `TpGroup`
and none of this runs.

Payloads are CPU tensors whose size every rank knows from its own batch. The plan is the
msgspec (msgpack) encoding of `PlanMessage` (arrangement, Dmax, per row D_r, has_q, source by
name and its Dmax tokens), validated on decode like the link's messages, in a uint8 tensor of
`plan_size(B, γ)` bytes (a 4-byte length, the encoding, zero padding up to a bound that holds any
plan of B rows at γ), so one broadcast of a size every rank computes carries it. The outcome is
int64 [2, B] (k, t*).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import torch
import torch.distributed as dist
from msgspec import Meta

from sglang_ssd.saguaro.draft_kinds import round_sources
from sglang_ssd.worker.draft_batch import DraftBatch
from sglang_ssd.worker.round_mode import Arrangement, RoundMode, round_mode
from sglang_ssd.worker.verify_step import VerifiedBatch, chain_layout

# `DraftBatch.sources` values a plan may carry ("missing" never leaves the client).
SOURCES = round_sources()
_LENGTH_BYTES = 4


class PlanRow(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """One request's draft in a broadcast plan: its depth D_r, whether rank 0 holds its q, its
    source and its Dmax tokens (-1 past D_r)."""

    depth: Annotated[int, Meta(ge=0)]
    has_q: bool
    source: Literal[SOURCES]  # type: ignore[valid-type]
    tokens: list[Annotated[int, Meta(ge=-1, le=2**31 - 1)]]


class PlanMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """A decode round's plan as rank 0 broadcasts it: its arrangement, Dmax and one row per
    request."""

    arrangement: Literal[tuple(a.value for a in Arrangement)]  # type: ignore[valid-type]
    depth_max: Annotated[int, Meta(ge=0)]
    rows: list[PlanRow]


_PLAN_DECODER = msgspec.msgpack.Decoder(PlanMessage)


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
    """What a decode round does, as rank 0 decided it: its arrangement of the cores
    (`round_mode.Arrangement`) and its drafts (none in a plain round)."""

    arrangement: Arrangement
    drafts: DraftBatch

    @property
    def mode(self) -> RoundMode:
        """The round's verify: γ + 1 positions per request, or the root alone (plain)."""
        return round_mode(self.arrangement)

    @property
    def sync(self) -> bool:
        """A sync round: drafted just in time, no pre-speculation before or after it."""
        return self.arrangement == Arrangement.SYNC

    def width(self, lookahead: int) -> int:
        """W, the positions per request of the round's TARGET_VERIFY forward at γ =
        `lookahead`: the root and γ draft slots, or the root alone in a plain round."""
        return lookahead + 1 if self.mode == RoundMode.SPECULATE else 1

    @property
    def lends_cores(self) -> bool:
        """Whether the forward runs on the speculator's cores too (a plain or a sync round:
        the speculator is stopped meanwhile, `core_lending`)."""
        return self.arrangement != Arrangement.ASYNC


def plan_size(batch_size: int, lookahead: int) -> int:
    """Bytes of a broadcast plan of `batch_size` rows at lookahead γ = `lookahead`: the length
    prefix plus a bound on any plan's encoding (msgpack: an int takes at most 9 bytes, a row's
    array and list headers 5 each, a source name 5 + its length)."""
    longest = max(len(s) for s in SOURCES)
    row = 5 + 9 + 1 + (5 + longest) + 5 + 9 * lookahead
    return _LENGTH_BYTES + 64 + batch_size * row


def pack_plan(plan: RoundPlan, lookahead: int) -> torch.Tensor:
    """The plan as one broadcastable tensor.

    Args:
        plan: the round's arrangement and drafts (tokens int64 [B, Dmax] -1 padded, Dmax ≤ γ).
        lookahead: γ.

    Returns:
        uint8 [plan_size(B, γ)] on the CPU: the encoding's length (4 bytes, little endian),
        the msgpack encoding of `PlanMessage`, zeros.

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
    rows = [
        PlanRow(depth=d, has_q=q, source=src, tokens=t)
        for d, q, src, t in zip(
            drafts.depth.tolist(), drafts.has_q.tolist(), drafts.sources,
            drafts.tokens.cpu().tolist(), strict=True,
        )
    ]  # fmt: skip
    body = msgspec.msgpack.encode(PlanMessage(plan.arrangement.value, depth_max, rows))
    out = torch.zeros(plan_size(b, lookahead), dtype=torch.uint8)
    frame = len(body).to_bytes(_LENGTH_BYTES, "little") + body
    if len(frame) > out.numel():
        raise ValueError(f"a plan of {len(frame)} bytes exceeds its bound of {out.numel()}")
    out[: len(frame)] = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
    return out


def unpack_plan(payload: torch.Tensor, batch_size: int, lookahead: int) -> RoundPlan:
    """The plan `pack_plan` packed (q is not carried: `q=None`).

    Args:
        payload: uint8 [plan_size(batch_size, lookahead)].
        batch_size: B, this rank's batch size.
        lookahead: γ.

    Raises:
        ValueError: a payload of the wrong size, one that does not decode to a valid
            `PlanMessage` (an unknown arrangement or source, a wrong type), or a plan that does not
            fit this rank's batch and γ (ranks that disagree on the batch, or a corrupt
            broadcast).
    """
    if payload.shape != (plan_size(batch_size, lookahead),):
        raise ValueError(
            f"plan of {tuple(payload.shape)} bytes for a batch of {batch_size} at γ={lookahead}"
        )
    raw = payload.numpy().tobytes()
    length = int.from_bytes(raw[:_LENGTH_BYTES], "little")
    if length > len(raw) - _LENGTH_BYTES:
        raise ValueError(f"plan length {length} out of range")
    try:
        message = _PLAN_DECODER.decode(raw[_LENGTH_BYTES : _LENGTH_BYTES + length])
    except msgspec.DecodeError as err:  # ValidationError is a subclass
        raise ValueError(f"corrupt plan broadcast: {err}") from err
    depth_max = message.depth_max
    if len(message.rows) != batch_size or depth_max > lookahead:
        raise ValueError(
            f"plan of {len(message.rows)} rows at depth {depth_max} for a batch of "
            f"{batch_size} at γ={lookahead}"
        )
    if any(r.depth > depth_max or len(r.tokens) != depth_max for r in message.rows):
        raise ValueError("plan rows carry a depth or token count out of range")
    rows = message.rows
    drafts = DraftBatch(
        tokens=torch.tensor([r.tokens for r in rows], dtype=torch.int64).reshape(
            batch_size, depth_max
        ),
        depth=torch.tensor([r.depth for r in rows], dtype=torch.int64),
        q=None,
        has_q=torch.tensor([r.has_q for r in rows], dtype=torch.bool),
        sources=[r.source for r in rows],
    )
    return RoundPlan(arrangement=Arrangement(message.arrangement), drafts=drafts)


def share_plan(
    tp: TpGroup, batch_size: int, lookahead: int, decide: Callable[[], RoundPlan]
) -> RoundPlan:
    """The round's plan on every rank: rank 0 calls `decide` (arrangement, drafts: the speculator's
    or the fallback's) and broadcasts it; the other ranks never call it and return rank 0's.

    Args:
        tp: the TP group.
        batch_size: B (every rank runs the same batch).
        lookahead: γ.
        decide: rank 0's planning (`SSDWorker` asks its `RoundPlanner`, then its
            `SpeculatorClient`).

    Raises:
        RuntimeError: from torch.distributed when a peer is gone or the broadcast times out.
        ValueError: from `pack_plan` / `unpack_plan`.
    """
    if tp.leader:
        plan = decide()
        dist.broadcast(pack_plan(plan, lookahead), group=tp.group, group_src=0)
        return plan
    payload = torch.empty(plan_size(batch_size, lookahead), dtype=torch.uint8)
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

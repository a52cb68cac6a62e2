"""Pack several requests' query tokens into one draft forward with a per-request custom mask.

Every draft forward of the speculator (prefill, just-in-time drafting, glue decode and each
tree-decode depth) is one `DraftModel.forward` over a packed list of segments, one per request.
A segment's queries attend to a list of KV-pool slots (`kv_slots`, which includes the queries'
own new slots) under a boolean mask [Q, K]; the layout follows FlashInfer's paged-prefill
convention with page size 1 (see `sglang_ssd_kernels.branch_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sglang_ssd.speculator.draft_model import AttentionLayout, HeadInputs
from sglang_ssd.speculator.target_features import TargetFeatures


@dataclass
class Segment:
    """One request's queries in a packed forward.

    Attributes:
        tokens: int64 [Q], the tokens fed.
        positions: int64 [Q], their logical positions (RoPE).
        out_slots: int64 [Q], pool slots their K/V are written to.
        kv_slots: int64 [K], the slots the queries may attend to (must contain `out_slots`).
        mask: bool [Q, K], which of `kv_slots` each query sees.
        prev_slots: int64 [Q], the slot of each query's predecessor on its path (the token
            before it; -1 at position 0): what an EAGLE-3 head reads its hidden from
            (`head_model.HeadInputs`).
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    out_slots: torch.Tensor
    kv_slots: torch.Tensor
    mask: torch.Tensor
    prev_slots: torch.Tensor
    features: torch.Tensor | None = None
    known: torch.Tensor | None = None

    def with_features(self, features: TargetFeatures | None) -> Segment:
        """This segment with its queries' own target features (`TargetFeatures.at`; the
        positions must be consecutive, as a causal segment's are); None changes nothing."""
        if features is not None and self.tokens.numel():
            start = int(self.positions[0])
            self.features, self.known = features.at(start, self.tokens.numel())
        return self


def causal_segment(
    context_slots: torch.Tensor,
    tokens: torch.Tensor,
    start_position: int,
    out_slots: torch.Tensor,
) -> Segment:
    """Queries that extend a sequence: each sees all of `context_slots` and the earlier new tokens.

    Args:
        context_slots: int64 [C], the request's already-fed prefix.
        tokens: int64 [Q], new tokens at positions start_position .. start_position + Q - 1.
        out_slots: int64 [Q], their new slots.
    """
    q = tokens.numel()
    c = context_slots.numel()
    mask = torch.ones(q, c + q, dtype=torch.bool)
    mask[:, c:] = torch.ones(q, q, dtype=torch.bool).tril()
    first = context_slots[-1:] if c else torch.full((1,), -1, dtype=torch.int64)
    return Segment(
        tokens=tokens,
        positions=torch.arange(start_position, start_position + q, dtype=torch.int64),
        out_slots=out_slots,
        kv_slots=torch.cat([context_slots, out_slots]),
        mask=mask,
        prev_slots=torch.cat([first.to(out_slots.device), out_slots[:-1]]),
    )


def tree_segment(
    context_slots: torch.Tensor,
    context_lens: torch.Tensor,
    branch_slots: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
) -> Segment:
    """One tree-decode depth for all branches of one request.

    Branch b forks from the shared path after `context_lens[b]` tokens and has fed `s` tokens of
    its own so far, this depth's included (Saguaro's fork/tree decode, docs/design.md#one-round): it
    sees
    `context_slots[:context_lens[b]]` and its own `branch_slots[b, :s]`, nothing of other
    branches.

    Args:
        context_slots: int64 [C], the request's fed path (committed prefix + glue).
        context_lens: int64 [N], visible path length per branch.
        branch_slots: int64 [N, s], each branch's slots by depth; column s-1 is this depth's.
        tokens: int64 [N], the tokens fed at this depth.
        positions: int64 [N], their logical positions.
    """
    n, s = branch_slots.shape
    c = context_slots.numel()
    path_mask = torch.arange(c).unsqueeze(0) < context_lens.unsqueeze(1)  # [N, C]
    own = torch.eye(n, dtype=torch.bool).repeat_interleave(s, dim=1)  # [N, N*s]
    prev = branch_slots[:, s - 2] if s > 1 else context_slots[context_lens.to(torch.int64) - 1]
    return Segment(
        tokens=tokens,
        positions=positions,
        out_slots=branch_slots[:, s - 1].contiguous(),
        kv_slots=torch.cat([context_slots, branch_slots.reshape(-1)]),
        mask=torch.cat([path_mask, own], dim=1),
        prev_slots=prev.contiguous(),
    )


@dataclass
class PackedForward:
    """The arguments of one `DraftModel.forward`, plus where each segment's queries landed and
    each query's predecessor slot (`Segment.prev_slots`, for an EAGLE-3 head)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_slots: torch.Tensor
    layout: AttentionLayout
    query_offsets: list[int]
    head_inputs: HeadInputs

    def rows(self, segment: int, local: torch.Tensor | list[int]) -> torch.Tensor:
        """Packed row indices of `segment`'s queries `local` (int64)."""
        return torch.as_tensor(local, dtype=torch.int64) + self.query_offsets[segment]


def pack(segments: list[Segment], device: torch.device | str = "cpu") -> PackedForward:
    """Concatenate `segments` into one forward's inputs and FlashInfer-style layout.

    Raises:
        ValueError: if there is no query at all or a mask has the wrong shape.
    """
    if not segments or sum(s.tokens.numel() for s in segments) == 0:
        raise ValueError("pack needs at least one query token")
    qo = [0]
    kv = [0]
    for s in segments:
        if s.mask.shape != (s.tokens.numel(), s.kv_slots.numel()):
            raise ValueError(
                f"mask {tuple(s.mask.shape)} != [Q={s.tokens.numel()}, K={s.kv_slots.numel()}]"
            )
        qo.append(qo[-1] + s.tokens.numel())
        kv.append(kv[-1] + s.kv_slots.numel())
    layout = AttentionLayout(
        qo_indptr=torch.tensor(qo, dtype=torch.int32, device=device),
        kv_indptr=torch.tensor(kv, dtype=torch.int32, device=device),
        kv_indices=torch.cat([s.kv_slots for s in segments]).to(device),
        custom_mask=torch.cat([s.mask.reshape(-1) for s in segments]).to(device),
    )
    return PackedForward(
        input_ids=torch.cat([s.tokens for s in segments]).to(device),
        positions=torch.cat([s.positions for s in segments]).to(device),
        out_slots=torch.cat([s.out_slots for s in segments]).to(device),
        layout=layout,
        query_offsets=qo[:-1],
        head_inputs=_head_inputs(segments, device),
    )


def _head_inputs(segments: list[Segment], device: torch.device | str) -> HeadInputs:
    """The segments' predecessor slots and own features, concatenated (features None when no
    segment has any)."""
    prev = torch.cat([s.prev_slots.to(torch.int64) for s in segments]).to(device)
    with_feats = [s.features for s in segments if s.features is not None]
    if not with_feats:
        return HeadInputs(prev)
    width, dtype = with_feats[0].shape[1], with_feats[0].dtype
    feats = [
        s.features if s.features is not None else torch.zeros(s.tokens.numel(), width, dtype=dtype)
        for s in segments
    ]
    known = [
        s.known if s.known is not None else torch.zeros(s.tokens.numel(), dtype=torch.bool)
        for s in segments
    ]
    return HeadInputs(prev, torch.cat(feats).to(device), torch.cat(known).to(device))


def run_packed(
    model: Any, packed: PackedForward, phase: str, logits_rows: torch.Tensor | None = None
) -> torch.Tensor:
    """`model.forward` (a `DraftModel` or `HeadDraftModel`) over `packed`: its tokens,
    positions, out slots, layout and head inputs; returns the float32 [M or N, V] logits."""
    return model.forward(
        packed.input_ids,
        packed.positions,
        packed.out_slots,
        packed.layout,
        logits_rows=logits_rows,
        phase=phase,
        head_inputs=packed.head_inputs,
    )

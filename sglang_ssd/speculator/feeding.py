"""Causal forwards that extend requests' fed prefixes: committed tokens, or one token each.

Each call is one batched `DraftModel.forward` over all the given requests, writing the new
tokens' K/V into freshly allocated pool slots and appending those slots to each request's
`slots` (the invariant of `state.RequestState`). The caller checks the pool can hold them
(`admission`).
"""

from __future__ import annotations

import torch

from sglang_ssd.speculator.packing import Segment, causal_segment, pack, run_packed
from sglang_ssd.speculator.runtimes import DraftRuntime
from sglang_ssd.speculator.state import RequestState


def feed_committed(
    model: DraftRuntime, states: list[RequestState], counts: list[int], phase: str = "prefill"
) -> torch.Tensor:
    """Feed the next `counts[i]` unfed committed tokens of each state (in one forward, timed
    as `phase` in `model.phases`).

    Returns:
        float32 [S, V], the logits at the last fed token of each of the S states with a count
        > 0, in order (empty [0, V] when there is nothing to feed).

    Raises:
        KVPoolExhausted: when the pool cannot hold the tokens (nothing is fed then).
    """
    fed: list[RequestState] = []
    todos: list[torch.Tensor] = []
    for s, n in zip(states, counts, strict=True):
        todo = torch.tensor(s.committed[s.num_fed : s.num_fed + n], dtype=torch.int64)
        if todo.numel():
            fed.append(s)
            todos.append(todo)
    if not fed:
        return torch.empty(0, model.vocab_size)
    # One allocation for all, so that a pool that cannot hold them is left untouched.
    slots = model.kv_pool.alloc(sum(int(t.numel()) for t in todos))
    built: list[Segment] = []
    offset = 0
    for s, todo in zip(fed, todos, strict=True):
        n = int(todo.numel())
        seg = causal_segment(s.slots, todo, s.num_fed, slots[offset : offset + n])
        built.append(seg.with_features(s.features))
        offset += n
    packed = pack(built, model.device)
    last = torch.tensor(
        [o + seg.tokens.numel() - 1 for o, seg in zip(packed.query_offsets, built, strict=True)]
    )
    logits = run_packed(model, packed, phase, logits_rows=last)
    for s, seg in zip(fed, built, strict=True):
        s.slots = torch.cat([s.slots, seg.out_slots])
        s.trim_fed_features()
    return logits


def feed_tokens(
    model: DraftRuntime, states: list[RequestState], tokens: list[int], phase: str = "jit"
) -> torch.Tensor:
    """Feed one token per state after its fed prefix (one forward, timed as `phase`); returns
    logits float32 [len(states), V].

    Raises:
        KVPoolExhausted: when the pool cannot hold them (nothing is fed then).
    """
    slots = model.kv_pool.alloc(len(states))
    segments = [
        causal_segment(s.slots, torch.tensor([t]), s.num_fed, slots[i : i + 1])
        for i, (s, t) in enumerate(zip(states, tokens, strict=True))
    ]
    packed = pack(segments, model.device)
    logits = run_packed(model, packed, phase)
    for s, seg in zip(states, segments, strict=True):
        s.slots = torch.cat([s.slots, seg.out_slots])
    return logits

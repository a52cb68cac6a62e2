"""Pre-speculation: build next round's speculation cache while the target verifies this one.

For every request with an outstanding draft (docs/design.md#one-round, paper §4):
1. glue decode: feed the unfed rest of committed + draft in one forward, which reveals the
   draft's most likely bonus candidates at every fork point k (accept length);
2. fork: at each k, the top F_k of those candidates other than d_{k+1} become branches;
3. tree decode: D tokens for every branch of every request, one batched forward per depth;
4. populate: the branches' tokens and q rows go to the speculation cache, their KV slots to the
   request's `Branches`, where `SpeculatorEngine.apply_outcomes` looks for the verified outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_ssd.saguaro import SpeculationCache
from sglang_ssd.speculator.drafting import DraftSample, draft_probs_at, pad_rows, sample_drafts
from sglang_ssd.speculator.fanout_plan import FanoutPlan
from sglang_ssd.speculator.packing import causal_segment, pack, run_packed, tree_segment
from sglang_ssd.speculator.runtimes import DraftRuntime
from sglang_ssd.speculator.state import Branches, RequestState


def prespeculate(
    model: DraftRuntime,
    cache: SpeculationCache,
    states: list[RequestState],
    plan: FanoutPlan,
    beta: float,
    tree_depth: int,
) -> None:
    """Glue, fork, tree-decode and cache the branches of `states` (1 + `tree_depth` forwards).

    Args:
        model: the draft model and its KV pool.
        cache: the speculation cache the branches' drafts are added to.
        states: requests with an outstanding draft and no branches yet.
        plan: this round's fan-out (F_k per draft depth, M_j for Saguaro sampling).
        beta: Saguaro's β in (0, 1] for the branches' draft tokens.
        tree_depth: D >= 1, tokens decoded per branch.

    Sets each state's `branches` (None where it forks nothing) and its draft's `candidates`.
    """
    glue_decode(model, states, plan)
    forks = []
    for s, fanout in zip(states, plan.fanouts(states), strict=True):
        ks, ts = fork(s, fanout)
        if ks:
            slots = model.kv_pool.alloc(len(ks) * tree_depth).view(len(ks), tree_depth)
            forks.append(_Fork(s, ks, ts, slots))
    if forks:
        steps = _tree_decode(model, forks, plan, beta, tree_depth)
        with model.phases.phase("populate"):
            for f, drawn in zip(forks, steps, strict=True):
                _populate(cache, f, drawn)


def glue_decode(model: DraftRuntime, states: list[RequestState], plan: FanoutPlan) -> None:
    """Feed the unfed rest of committed + draft; fill the fork candidates it reveals.

    A draft without candidates (point mass or first round) gets all D + 1 rows, one with
    candidates from its own sampling gets only row D (all accepted), which only glue sees.
    One forward for a causal LM; for an EAGLE-3 head, whose rows after the first one without
    the target's features read the row before (`glue_waves`), one forward per such row.
    """
    todos, slots, need_rows, waves = [], [], [], []
    for s in states:
        todo = torch.tensor(s.sequence[s.num_fed :], dtype=torch.int64)
        todos.append(todo)
        slots.append(model.kv_pool.alloc(todo.numel()))
        root = len(s.committed) - 1
        ks = range(s.draft.depth + 1) if s.draft.candidates is None else [s.draft.depth]
        need_rows.append([root + k - s.num_fed for k in ks])
        waves.append(glue_waves(s, todo.numel()))
    got: list[dict[int, torch.Tensor]] = [{} for _ in states]
    for w in range(max(len(x) for x in waves)):
        todo_now = [i for i in range(len(states)) if w < len(waves[i])]
        segments, wanted = [], []
        for i in todo_now:
            s, (lo, hi) = states[i], waves[i][w]
            seg = causal_segment(s.slots, todos[i][lo:hi], s.num_fed, slots[i][lo:hi])
            segments.append(seg.with_features(s.features))
            wanted.append([r for r in need_rows[i] if lo <= r < hi])
        packed = pack(segments, model.device)
        local = [[r - waves[i][w][0] for r in wanted[j]] for j, i in enumerate(todo_now)]
        rows = torch.cat([packed.rows(j, r) for j, r in enumerate(local)])
        # A wave may want no logits (committed rows only): the head runs on one row then.
        logits = run_packed(model, packed, "glue", rows if rows.numel() else rows.new_zeros(1))
        offset = 0
        for j, i in enumerate(todo_now):
            states[i].slots = torch.cat([states[i].slots, segments[j].out_slots])
            for r in wanted[j]:
                got[i][r] = logits[offset]
                offset += 1
    for s, r, rows_of in zip(states, need_rows, got, strict=True):
        depth = s.draft.depth
        num_cand = plan.num_candidates(depth)
        picked = torch.stack([rows_of[x] for x in r]).float()
        top = torch.topk(picked, k=num_cand, dim=-1).indices
        top_probs = draft_probs_at(picked, [s] * len(r), top)
        if s.draft.candidates is None:
            s.draft.candidates, s.draft.probs = top, top_probs
            drafted = torch.tensor(s.draft.tokens, dtype=torch.int64, device=picked.device)
            s.draft.token_probs = draft_probs_at(picked[:depth], [s] * depth, drafted.view(-1, 1))
            s.draft.token_probs = s.draft.token_probs.view(-1)
        else:
            width = max(num_cand, s.draft.candidates.shape[1])
            s.draft.candidates = pad_rows([*list(s.draft.candidates[:depth]), top[0]], width)
            if s.draft.probs is not None:
                s.draft.probs = pad_rows([*list(s.draft.probs[:depth]), top_probs[0]], width, 0.0)


def glue_waves(state: RequestState, n: int) -> list[tuple[int, int]]:
    """The forwards glue splits a request's `n` unfed rows into, as [lo, hi) ranges: all in
    one, unless the draft reads the target's features (`state.features`) and some rows have
    none: then the rows up to the first of those, then one row per forward (each reads the
    head's hidden of the row before it, `head_model`)."""
    if state.features is None or n == 0:
        return [(0, n)]
    _, known = state.features.at(state.num_fed, n)
    unknown = (~known).nonzero()
    if unknown.numel() == 0:
        return [(0, n)]
    first = int(unknown[0]) + 1
    return [(0, first)] + [(i, i + 1) for i in range(first, n)]


def fork(state: RequestState, fanout: list[int]) -> tuple[list[int], list[int]]:
    """The (k, t) outcomes to pre-speculate: top F_k candidates at each k, minus d_{k+1}
    (`fanout`: F_0..F_D of this draft, `FanoutPlan.fanouts`)."""
    draft = state.draft
    ks: list[int] = []
    ts: list[int] = []
    for k, f in enumerate(fanout[: draft.depth + 1]):
        if f == 0:
            continue
        row = draft.candidates[k]
        row = row[row >= 0]
        if k < draft.depth:
            row = row[row != draft.tokens[k]]
        for t in row[:f].tolist():
            ks.append(k)
            ts.append(int(t))
    return ks, ts


@dataclass
class _Fork:
    """One request's branches: outcome (ks[i], ts[i]) decodes into slots[i] ([N, D] int64)."""

    state: RequestState
    ks: list[int]
    ts: list[int]
    slots: torch.Tensor


def _tree_decode(
    model: DraftRuntime, forks: list[_Fork], plan: FanoutPlan, beta: float, tree_depth: int
) -> list[list[DraftSample]]:
    """Decode `tree_depth` tokens for every branch, one forward per depth over all requests.

    Returns per fork, per depth, the `DraftSample` of its N branches.
    """
    top_m = plan.top_m(tree_depth)
    num_cand = plan.num_candidates(tree_depth)
    counts = [len(f.ks) for f in forks]
    row_states = [f.state for f, n in zip(forks, counts, strict=True) for _ in range(n)]
    fed = [torch.tensor(f.ts, dtype=torch.int64) for f in forks]
    drawn: list[list[DraftSample]] = [[] for _ in forks]
    for depth in range(1, tree_depth + 1):
        segments = []
        for f, tokens in zip(forks, fed, strict=True):
            kt = torch.tensor(f.ks, dtype=torch.int64)
            base = len(f.state.committed)
            segments.append(
                tree_segment(
                    f.state.slots, base + kt, f.slots[:, :depth], tokens, base + kt + depth - 1
                )
            )
        packed = pack(segments, model.device)
        logits = run_packed(model, packed, f"tree_{depth}")
        with model.phases.phase("sampling"):
            sample = sample_drafts(
                logits, row_states, [top_m[depth - 1]] * len(row_states), beta, num_cand
            )
        offset = 0
        for i, n in enumerate(counts):
            part = DraftSample(
                tokens=sample.tokens[offset : offset + n],
                q=sample.q[offset : offset + n],
                candidates=sample.candidates[offset : offset + n],
                probs=sample.probs[offset : offset + n],
                token_probs=sample.token_probs[offset : offset + n],
            )
            drawn[i].append(part)
            fed[i] = part.tokens
            offset += n
    return drawn


def _populate(cache: SpeculationCache, f: _Fork, steps: list[DraftSample]) -> None:
    """Cache one request's decoded branches and keep their slots as its `Branches`."""
    tokens = torch.stack([d.tokens for d in steps], dim=1)  # [N, D]
    probs = None
    if not f.state.is_greedy:
        probs = torch.stack([torch.stack(d.q) for d in steps], dim=1)  # [N, D, V]
    cands = torch.stack([d.candidates for d in steps], dim=1)  # [N, D, C]
    cands = torch.cat([cands, torch.full_like(cands[:, :1], -1)], dim=1)
    cand_probs = torch.stack([d.probs for d in steps], dim=1)  # [N, D, C]
    cand_probs = torch.cat([cand_probs, torch.zeros_like(cand_probs[:, :1])], dim=1)
    cache.populate(f.state.rid, f.ks, f.ts, tokens, probs)
    f.state.branches = Branches(
        ks=f.ks,
        bonus=f.ts,
        slots=f.slots,
        candidates=cands,
        probs=cand_probs,
        token_probs=torch.stack([d.token_probs for d in steps], dim=1),  # [N, D]
    )

"""The speculator's round: apply outcomes, serve drafts, pre-speculate the next round.

One round for a batch of requests (DESIGN.md §1, paper §4):
1. `apply_outcomes`: the target's verified outcome (k, t*) per request commits d_1..d_k + t*;
   a cached branch for (k, t*) becomes the next draft (its KV slots are kept), all other
   branch slots are freed.
2. `serve`: requests without a hit get the backup the target chose (just-in-time primary
   draft, n-gram or random).
3. `build` (async mode only, after the drafts were sent): glue decode over each request's
   draft, fork the top-F_k bonus candidates at every accept length k (geometric fan-out),
   tree-decode D tokens for every branch with one batched forward per depth, and populate the
   speculation cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import (
    NgramSpeculator,
    RandomSpeculator,
    SpeculationCache,
    alpha_from_accept_length,
    geometric_fanout,
    uniform_fanout,
)
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.drafting import sample_drafts
from sglang_ssd.speculator.packing import Segment, causal_segment, pack, tree_segment
from sglang_ssd.speculator.state import Branches, Draft, RequestState

logger = logging.getLogger(__name__)

# Exponent of the cache-hit power law 1 - p_hit(F) ~ c F^-r (Definition 11) until measured.
DEFAULT_HIT_EXPONENT = 0.7
# Per-token acceptance assumed before any round was observed.
DEFAULT_ALPHA = 0.8
EMA_WEIGHT = 0.1


@dataclass
class OutcomeIn:
    """A verified outcome for one request: k accepted drafts, then bonus token t*."""

    rid: str
    accept_len: int
    bonus: int


class SpeculatorEngine:
    """Owns the draft model, per-request state, the speculation cache and the backups.

    Args:
        model: the draft model with its paged KV pool.
        config: SSD settings (β, fan-out, tree depth, lookahead γ, mode).
        seed: seeds the per-request draft generators (independent of the target's RNG).
    """

    def __init__(self, model: DraftModel, config: SSDConfig, seed: int | None = None) -> None:
        self.model = model
        self.config = config
        self.vocab_size = model.vocab_size
        self.requests: dict[str, RequestState] = {}
        self.cache = SpeculationCache(self.vocab_size, max_bytes=1 << 30)
        self.ngram = NgramSpeculator()
        self._seed_source = torch.Generator().manual_seed(
            seed if seed is not None else int(time.time_ns() & 0x7FFFFFFF)
        )
        self.random = RandomSpeculator(self.vocab_size, self._new_generator())
        self.accept_len_ema = DEFAULT_ALPHA * config.lookahead
        self.hit_exponent = DEFAULT_HIT_EXPONENT
        self.counters: dict[str, float] = {}

    # ---------------------------------------------------------------- lifecycle
    def _new_generator(self, seed: int | None = None) -> torch.Generator:
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
        return torch.Generator().manual_seed(seed ^ 0x5D2A_9E37)

    def open(
        self,
        rid: str,
        token_ids: Sequence[int],
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int | None = None,
    ) -> None:
        """Start tracking a request and prefill its tokens except the last (the root).

        Re-opening a known rid replaces it. Raises ValueError on an empty token list or a token
        outside the vocabulary.
        """
        tokens = [int(t) for t in token_ids]
        if not tokens or min(tokens) < 0 or max(tokens) >= self.vocab_size:
            raise ValueError(f"open({rid!r}): tokens must be non-empty ids in [0, V)")
        self.close(rid)
        state = RequestState(
            rid=rid,
            committed=tokens,
            temperature=float(temperature),
            top_k=int(top_k),
            top_p=float(top_p),
            generator=self._new_generator(seed),
        )
        self.requests[rid] = state
        self._feed_causal([state], upto_root=True)

    def close(self, rid: str) -> bool:
        """Forget a request and free its KV slots and cache entries. False if unknown."""
        state = self.requests.pop(rid, None)
        if state is None:
            return False
        self._drop_branches(state)
        self.model.kv_pool.free(state.slots)
        self.cache.remove(rid)
        return True

    def num_used_slots(self) -> int:
        return self.model.kv_pool.num_used

    # ---------------------------------------------------------------- outcomes
    def apply_outcomes(self, outcomes: Sequence[OutcomeIn]) -> list[str]:
        """Commit each verified outcome; a cached branch for it becomes the next draft.

        Returns:
            The rids whose outcome could not be applied (unknown rid, k larger than the
            outstanding draft, token outside the vocabulary); the caller treats them as missing.
        """
        failed = []
        for o in outcomes:
            state = self.requests.get(o.rid)
            depth = state.draft.depth if state is not None and state.draft is not None else 0
            if (
                state is None
                or not 0 <= o.accept_len <= depth
                or not 0 <= o.bonus < self.vocab_size
            ):
                logger.warning("speculator: cannot apply outcome %s (draft depth %d)", o, depth)
                if state is not None:
                    self.close(o.rid)
                failed.append(o.rid)
                continue
            self._apply_one(state, o.accept_len, o.bonus)
        return failed

    def _apply_one(self, state: RequestState, k: int, bonus: int) -> None:
        draft = state.draft
        drafted = draft.tokens[:k] if draft is not None else []
        n_old = len(state.committed)
        state.committed = state.committed + drafted + [bonus]
        keep = min(state.num_fed, n_old + k)
        self.model.kv_pool.free(state.slots[keep:])
        state.slots = state.slots[:keep]
        state.draft = None
        branches = state.branches
        state.branches = None
        state.round_id += 1
        if branches is None:
            self.cache.remove(state.rid)
            return
        found = self.cache.lookup([state.rid], [k], [bonus])
        row = int(found.rows[0])
        if row >= 0 and keep == n_old + k:
            state.count("hits")
            state.slots = torch.cat([state.slots, branches.slots[row]])
            others = torch.ones(branches.slots.shape[0], dtype=torch.bool)
            others[row] = False
            self.model.kv_pool.free(branches.slots[others].reshape(-1))
            q = found.dense_probs()[0] if not bool(found.point_mass[0]) else None
            state.draft = Draft(
                tokens=found.draft_tokens[0].tolist(),
                q=None if state.is_greedy else q,
                candidates=branches.candidates[row],
                source="cache",
                round_id=state.round_id,
            )
        else:
            state.count("misses")
            self.model.kv_pool.free(branches.slots.reshape(-1))
        self.cache.remove(state.rid)

    def _drop_branches(self, state: RequestState) -> None:
        if state.branches is not None:
            self.model.kv_pool.free(state.branches.slots.reshape(-1))
            state.branches = None

    # ---------------------------------------------------------------- serving
    def serve(self, rids: Sequence[str], backup: str, depth: int) -> list[Draft | None]:
        """The draft of each request: its cache hit, else the backup (`jit`, `ngram`, `random`).

        Args:
            rids: requests that need a draft for this round, in batch order.
            backup: the fallback the target chose for this batch (Theorem 17).
            depth: D for backup drafts (γ).

        Returns:
            One `Draft` per rid, or None for an unknown rid ("missing").
        """
        states = [self.requests.get(r) for r in rids]
        for s in states:
            if s is not None and s.draft is not None and s.draft.depth == 0:
                self._drop_branches(s)  # a first-round pre-speculation nobody verified
                s.draft = None
        need = [s for s in states if s is not None and s.draft is None]
        if need:
            if backup == "jit":
                self._jit(need, depth, saguaro=self.config.mode == "async")
            else:
                for s in need:
                    self._point_mass(s, backup, depth)
            for s in need:
                s.count(f"backup_{backup}")
        return [None if s is None else s.draft for s in states]

    def _point_mass(self, state: RequestState, backup: str, depth: int) -> None:
        proposer = self.ngram if backup == "ngram" else self.random
        tokens = proposer.propose(state.committed, depth).tolist()
        state.draft = Draft(tokens, None, None, backup, state.round_id)

    def _jit(self, states: list[RequestState], depth: int, saguaro: bool) -> None:
        """Draft `depth` tokens for each state just in time: `depth` batched forwards."""
        fanout = self.fanout(depth)
        top_m = [f + 1 for f in fanout]
        beta = self.config.beta if saguaro else 1.0
        num_cand = max(fanout) + 1
        tokens: list[list[int]] = [[] for _ in states]
        qs: list[list[torch.Tensor | None]] = [[] for _ in states]
        cands: list[list[torch.Tensor]] = [[] for _ in states]
        for j in range(depth):
            if j == 0:
                logits = self._feed_causal(states, upto_root=False)
            else:
                logits = self._feed_tokens(states, [t[-1] for t in tokens])
            sample = sample_drafts(logits, states, [top_m[j]] * len(states), beta, num_cand)
            for i in range(len(states)):
                tokens[i].append(int(sample.tokens[i]))
                qs[i].append(sample.q[i])
                cands[i].append(sample.candidates[i])
        for i, s in enumerate(states):
            s.draft = Draft(
                tokens=tokens[i],
                q=None if s.is_greedy else torch.stack(qs[i]),  # type: ignore[arg-type]
                candidates=_pad_rows(cands[i] + [torch.empty(0, dtype=torch.int64)], num_cand),
                source="jit",
                round_id=s.round_id,
            )

    # ---------------------------------------------------------------- forwards
    def _feed_causal(self, states: list[RequestState], upto_root: bool) -> torch.Tensor:
        """Feed each state's unfed committed tokens (all but the root if `upto_root`).

        Returns the logits [S, V] at the last fed token of each of the S states that had
        tokens to feed, in order (with `upto_root=False` that is every state).
        """
        segments: list[Segment] = []
        fed: list[RequestState] = []
        for s in states:
            end = len(s.committed) - 1 if upto_root else len(s.committed)
            todo = torch.tensor(s.committed[s.num_fed : end], dtype=torch.int64)
            if todo.numel() == 0:
                continue
            slots = self.model.kv_pool.alloc(todo.numel())
            segments.append(causal_segment(s.slots, todo, s.num_fed, slots))
            fed.append(s)
        if not segments:
            return torch.empty(0, self.vocab_size)
        packed = pack(segments, self.model.device)
        last = torch.tensor(
            [
                o + seg.tokens.numel() - 1
                for o, seg in zip(packed.query_offsets, segments, strict=True)
            ]
        )
        logits = self.model.forward(
            packed.input_ids,
            packed.positions,
            packed.out_slots,
            packed.layout,
            logits_rows=last,
        )
        for s, seg in zip(fed, segments, strict=True):
            s.slots = torch.cat([s.slots, seg.out_slots])
        return logits

    def _feed_tokens(self, states: list[RequestState], tokens: list[int]) -> torch.Tensor:
        """Feed one token per state after its fed prefix; returns logits [len(states), V]."""
        slots = self.model.kv_pool.alloc(len(states))
        segments = [
            causal_segment(s.slots, torch.tensor([t]), s.num_fed, slots[i : i + 1])
            for i, (s, t) in enumerate(zip(states, tokens, strict=True))
        ]
        packed = pack(segments, self.model.device)
        logits = self.model.forward(
            packed.input_ids, packed.positions, packed.out_slots, packed.layout
        )
        for s, seg in zip(states, segments, strict=True):
            s.slots = torch.cat([s.slots, seg.out_slots])
        return logits

    # ---------------------------------------------------------------- pre-speculation
    def fanout(self, depth: int) -> list[int]:
        """F_0..F_D for a draft of `depth` tokens (Theorem 12 or uniform), from live α."""
        budget = self.config.fanout_budget
        if self.config.fanout == "uniform":
            return uniform_fanout(budget, depth, self.vocab_size)
        alpha = alpha_from_accept_length(
            min(max(self.accept_len_ema, 1.0), self.config.lookahead + 1 - 1e-3),
            self.config.lookahead,
        )
        alpha = min(max(alpha, 0.05), 0.98)
        return geometric_fanout(budget, depth, alpha, self.hit_exponent, self.vocab_size)

    def observe_accept_length(self, accept_len_with_bonus: float) -> None:
        """Feed the moving average of L that sets α for the geometric fan-out."""
        self.accept_len_ema += EMA_WEIGHT * (accept_len_with_bonus - self.accept_len_ema)

    def prespeculate_first_round(self, rid: str) -> None:
        """Pre-speculate the round after prefill: the target has not sampled the first token
        yet, so the outstanding "draft" is empty and every branch forks at k = 0 from the
        draft's top candidates for that token (the first Step's outcome is (0, t_1))."""
        state = self.requests.get(rid)
        if state is None or state.draft is not None:
            return
        state.draft = Draft(
            tokens=[], q=None, candidates=None, source="prefill", round_id=state.round_id
        )
        self.build([rid])

    def build(self, rids: Sequence[str]) -> None:
        """Pre-speculate the next round for `rids` (glue, fork, tree decode, populate)."""
        states = [s for r in rids if (s := self.requests.get(r)) is not None and s.draft]
        states = [s for s in states if s.branches is None]
        if not states or self.config.fanout_budget == 0:
            return
        self._glue(states)
        self._tree(states)

    def _glue(self, states: list[RequestState]) -> None:
        """Feed the unfed rest of committed + draft; fill the fork candidates it reveals."""
        segments = []
        need_rows: list[list[int]] = []
        for s in states:
            seq = s.sequence
            todo = torch.tensor(seq[s.num_fed :], dtype=torch.int64)
            slots = self.model.kv_pool.alloc(todo.numel())
            segments.append(causal_segment(s.slots, todo, s.num_fed, slots))
            root = len(s.committed) - 1
            ks = range(s.draft.depth + 1) if s.draft.candidates is None else [s.draft.depth]
            need_rows.append([root + k - s.num_fed for k in ks])
        packed = pack(segments, self.model.device)
        rows = torch.cat([packed.rows(i, r) for i, r in enumerate(need_rows)])
        logits = self.model.forward(
            packed.input_ids, packed.positions, packed.out_slots, packed.layout, logits_rows=rows
        )
        offset = 0
        for s, seg, r in zip(states, segments, need_rows, strict=True):
            s.slots = torch.cat([s.slots, seg.out_slots])
            depth = s.draft.depth
            num_cand = max(self.fanout(depth)) + 1
            top = torch.topk(logits[offset : offset + len(r)].float(), k=num_cand, dim=-1).indices
            offset += len(r)
            if s.draft.candidates is None:
                s.draft.candidates = top
            else:
                s.draft.candidates = _pad_rows(
                    [*list(s.draft.candidates[:depth]), top[0]],
                    max(num_cand, s.draft.candidates.shape[1]),
                )

    def _tree(self, states: list[RequestState]) -> None:
        """Fork every request's branches and decode them with one forward per depth."""
        tree_depth = self.config.depth
        next_fanout = self.fanout(tree_depth)
        top_m_next = [f + 1 for f in next_fanout]
        num_cand = max(next_fanout) + 1
        plans = []
        for s in states:
            ks, ts = self._fork(s)
            if ks:
                plans.append((s, ks, ts, self.model.kv_pool.alloc(len(ks) * tree_depth)))
        if not plans:
            return
        n = [len(p[1]) for p in plans]
        slot_mats = [p[3].view(len(p[1]), tree_depth) for p in plans]
        fed = [torch.tensor(p[2], dtype=torch.int64) for p in plans]
        drawn: list[list] = [[] for _ in plans]  # per plan: DraftSample per depth
        for depth in range(1, tree_depth + 1):
            segments = []
            for (s, ks, _, _), mat, tok in zip(plans, slot_mats, fed, strict=True):
                kt = torch.tensor(ks, dtype=torch.int64)
                base = len(s.committed)
                segments.append(
                    tree_segment(s.slots, base + kt, mat[:, :depth], tok, base + kt + depth - 1)
                )
            packed = pack(segments, self.model.device)
            logits = self.model.forward(
                packed.input_ids, packed.positions, packed.out_slots, packed.layout
            )
            row_states = [p[0] for p, count in zip(plans, n, strict=True) for _ in range(count)]
            sample = sample_drafts(
                logits,
                row_states,
                [top_m_next[depth - 1]] * len(row_states),
                self.config.beta,
                num_cand,
            )
            offset = 0
            for i, count in enumerate(n):
                part = slice(offset, offset + count)
                drawn[i].append((sample.tokens[part], sample.q[part], sample.candidates[part]))
                fed[i] = sample.tokens[part]
                offset += count
        for (s, ks, ts, _), mat, steps in zip(plans, slot_mats, drawn, strict=True):
            tokens = torch.stack([d[0] for d in steps], dim=1)  # [N, D]
            probs = None
            if not s.is_greedy:
                probs = torch.stack([torch.stack(d[1]) for d in steps], dim=1)  # [N, D, V]
            cands = torch.stack([d[2] for d in steps], dim=1)  # [N, D, C]
            cands = torch.cat([cands, torch.full_like(cands[:, :1], -1)], dim=1)
            self.cache.populate(s.rid, ks, ts, tokens, probs)
            s.branches = Branches(ks=ks, bonus=ts, slots=mat, candidates=cands)

    def _fork(self, state: RequestState) -> tuple[list[int], list[int]]:
        """The (k, t) outcomes to pre-speculate: top F_k candidates at each k, minus d_{k+1}."""
        draft = state.draft
        fanout = self.fanout(draft.depth)
        ks: list[int] = []
        ts: list[int] = []
        for k, f in enumerate(fanout):
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


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D int64 rows into [len(rows), width], padding with -1 (and cutting to width)."""
    out = torch.full((len(rows), width), -1, dtype=torch.int64)
    for i, r in enumerate(rows):
        r = r[:width]
        out[i, : r.numel()] = r
    return out

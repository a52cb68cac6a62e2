"""The speculator's per-request state machine: open, apply outcomes, serve drafts, close.

One round for a batch of requests (DESIGN.md §1, paper §4):
1. `apply_outcomes`: the target's verified outcome (k, t*) per request commits d_1..d_k + t*;
   a cached branch for (k, t*) becomes the next draft (its KV slots are kept), all other
   branch slots are freed.
2. `serve`: requests without a hit get the backup the target chose (just-in-time primary
   draft, n-gram or random).
3. `build` (async mode only, after the drafts were sent): pre-speculate the next round
   (`prespeculation`: glue, fork, tree decode, populate the speculation cache).
Each `serve` and `build` call computes the round's fan-out plan once (`fanout_plan`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import NgramSpeculator, RandomSpeculator, SpeculationCache
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.drafting import pad_rows, sample_drafts
from sglang_ssd.speculator.fanout_plan import FanoutPlan, LiveFanout
from sglang_ssd.speculator.packing import Segment, causal_segment, pack
from sglang_ssd.speculator.prespeculation import prespeculate
from sglang_ssd.speculator.state import Draft, RequestState

logger = logging.getLogger(__name__)


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
        self.live = LiveFanout(config.lookahead)

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

    def stats(self) -> dict[str, float]:
        """The engine's counters for `/ssd/stats`: the speculation cache's (`cache_*`), KV slots
        in use, open requests, cached entries and the live hit-model exponent r."""
        out = {f"cache_{k}": float(v) for k, v in self.cache.stats.items()}
        out["kv_slots_used"] = float(self.num_used_slots())
        out["open_requests"] = float(len(self.requests))
        out["cache_entries"] = float(self.cache.num_entries)
        out["hit_exponent"] = self.hit_exponent
        return out

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
        if branches is None:
            self.cache.remove(state.rid)
            return
        found = self.cache.lookup([state.rid], [k], [bonus])
        row = int(found.rows[0])
        hit = row >= 0 and keep == n_old + k
        self.live.observe_hit(branches.ks.count(k), hit)
        if hit:
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
            )
        else:
            self.model.kv_pool.free(branches.slots.reshape(-1))
        self.cache.remove(state.rid)

    def _unfeed_root(self, state: RequestState) -> None:
        root = len(state.committed) - 1
        self.model.kv_pool.free(state.slots[root:])
        state.slots = state.slots[:root]

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
                self._unfeed_root(s)  # its glue fed the root, which a backup draft starts from
        need = [s for s in states if s is not None and s.draft is None]
        if need:
            if backup == "jit":
                self._jit(need, depth, self.plan(), saguaro=self.config.mode == "async")
            else:
                for s in need:
                    self._point_mass(s, backup, depth)
        return [None if s is None else s.draft for s in states]

    def _point_mass(self, state: RequestState, backup: str, depth: int) -> None:
        proposer = self.ngram if backup == "ngram" else self.random
        tokens = proposer.propose(state.committed, depth).tolist()
        state.draft = Draft(tokens, None, None, backup)

    def _jit(self, states: list[RequestState], depth: int, plan: FanoutPlan, saguaro: bool) -> None:
        """Draft `depth` tokens for each state just in time: `depth` batched forwards."""
        top_m = plan.top_m(depth)
        beta = self.config.beta if saguaro else 1.0
        num_cand = plan.num_candidates(depth)
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
                candidates=pad_rows(cands[i] + [torch.empty(0, dtype=torch.int64)], num_cand),
                source="jit",
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
    def plan(self) -> FanoutPlan:
        """This round's fan-out plan, from the live α and r (one per `serve` / `build` call)."""
        return self.live.plan(self.config, self.vocab_size)

    def fanout(self, depth: int) -> list[int]:
        """F_0..F_D for a draft of `depth` tokens (Theorem 12 or uniform), from live α and r."""
        return self.plan().fanout(depth)

    @property
    def hit_exponent(self) -> float:
        """r of the hit model 1 - p_hit(F) ~ c F^-r, fitted from live outcomes."""
        return self.live.hit_exponent

    def observe_accept_length(self, accept_len_with_bonus: float) -> None:
        """Feed the moving average of L that sets α for the geometric fan-out."""
        self.live.observe_accept_length(accept_len_with_bonus)

    def prespeculate_first_round(self, rid: str) -> None:
        """Pre-speculate the round after prefill: the target has not sampled the first token
        yet, so the outstanding "draft" is empty and every branch forks at k = 0 from the
        draft's top candidates for that token (the first Step's outcome is (0, t_1))."""
        state = self.requests.get(rid)
        if state is None or state.draft is not None:
            return
        state.draft = Draft(tokens=[], q=None, candidates=None, source="prefill")
        self.build([rid])

    def build(self, rids: Sequence[str]) -> None:
        """Pre-speculate the next round for `rids` (glue, fork, tree decode, populate)."""
        states = [s for r in rids if (s := self.requests.get(r)) is not None and s.draft]
        states = [s for s in states if s.branches is None]
        if not states or self.config.fanout_budget == 0:
            return
        prespeculate(
            self.model, self.cache, states, self.plan(), self.config.beta, self.config.depth
        )

"""The speculator's per-request state machine: open, apply outcomes, serve drafts, close.

One round for a batch of requests (docs/design.md#one-round, paper §4):
1. `apply_outcomes`: the target's verified outcome (k, t*) per request commits d_1..d_k + t*;
   a cached branch for (k, t*) becomes the next draft (its KV slots are kept), all other
   branch slots are freed.
2. `serve`: requests without a hit get the backup the target chose (just-in-time primary
   draft, n-gram or random).
3. `build` (async mode only, after the drafts were sent): pre-speculate the next round
   (`prespeculation`: glue, fork, tree decode, populate the speculation cache).
Each `serve` and `build` call computes the round's fan-out plan once (`fanout_plan`).

The KV pool never overflows (`admission`): a request whose draft does not fit gets a point-mass
backup, one whose branches do not fit is not pre-speculated (its cache misses), both counted in
`stats()`. Prefill is fed in chunks: at most `idle_prefill_chunk_tokens` by `advance_prefill`
between rounds (a Step that arrives meanwhile waits for at most that chunk); `serve` feeds only
short backlogs (at most `serve_prefill_tokens`: a miss's unfed tokens), so a prompt's prefill
never holds up a round: a request whose prefill is not done gets a point-mass backup draft.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.phases import PhaseTimer
from sglang_ssd.saguaro import NgramSpeculator, RandomSpeculator, SpeculationCache, draft_kinds
from sglang_ssd.speculator.admission import admit, prefill_plan
from sglang_ssd.speculator.drafting import pad_rows, sample_drafts
from sglang_ssd.speculator.fanout_plan import FanoutPlan, LiveFanout
from sglang_ssd.speculator.feeding import feed_committed, feed_tokens
from sglang_ssd.speculator.packing import causal_segment, pack, run_packed
from sglang_ssd.speculator.prespeculation import prespeculate
from sglang_ssd.speculator.runtimes import DraftRuntime
from sglang_ssd.speculator.state import Draft, RequestState, empty_slots, generator_device
from sglang_ssd.speculator.target_features import TargetFeatures

if TYPE_CHECKING:
    from sglang_ssd.transport.messages import SpeculatorStats

logger = logging.getLogger(__name__)

# Prefill tokens fed per chunk inside `serve`, to requests whose backlog is at most
# SERVE_PREFILL_TOKENS (a miss's unfed accepted tokens; a plain round's): a Step never waits for
# a prompt's prefill, whose request gets a backup draft until its prefill is done between rounds.
PREFILL_CHUNK_TOKENS = 256
SERVE_PREFILL_TOKENS = 16
# Prefill tokens fed per chunk between rounds (`advance_prefill`): small, so that a Step arriving
# meanwhile (the running requests' next round while a new request prefills) waits little: ~0.2 s
# for 64 tokens of the 0.5B int8 draft on one core, against ~0.8 s for 256. Smaller chunks cost
# little: on the 2-core EPYC 50 tokens took 2.8 ms each, 246 tokens 3.4 ms each.
IDLE_PREFILL_CHUNK_TOKENS = 64


def request_seed(seed: int, rid: str) -> int:
    """The draft RNG seed of request `rid` whose sampling seed is `seed`: the two mixed
    (blake2b), in [0, 2^62).

    SGLang gives the n copies of an `n > 1` request one `sampling_seed` and distinct rids, and
    samples them independently (it uses the seed only under deterministic inference, which SSD
    refuses: sglang/srt/sampling/sampling_batch_info.py, `sampling_seed`). Seeding the draft
    with the seed alone would give the copies one draft stream: each copy's output still has
    the target's law, but the set would not be independent. Mixed with the rid, the copies
    draw independent drafts and a request's drafts stay reproducible from its seed.
    """
    digest = hashlib.blake2b(f"{int(seed)}:{rid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


@dataclass
class OutcomeIn:
    """A verified outcome for one request: k accepted drafts, then bonus token t*, then the
    `extra` tokens of plain rounds (committed without a draft)."""

    rid: str
    accept_len: int
    bonus: int
    extra: Sequence[int] = ()


class SpeculatorEngine:
    """Owns the draft model, per-request state, the speculation cache and the backups.

    Args:
        model: the draft model with its paged KV pool.
        config: SSD settings (β, fan-out, tree depth, lookahead γ, mode).
        seed: seeds the per-request draft generators (independent of the target's RNG).
    """

    def __init__(self, model: DraftRuntime, config: SSDConfig, seed: int | None = None) -> None:
        self.model = model
        self.config = config
        self.vocab_size = model.vocab_size
        self.requests: dict[str, RequestState] = {}
        self.cache = SpeculationCache(self.vocab_size, max_bytes=1 << 30)
        self.ngram = NgramSpeculator()
        self._seed_source = torch.Generator().manual_seed(
            seed if seed is not None else int(time.time_ns() & 0x7FFFFFFF)
        )
        # Random backup drafts stay below `token_limit` (the target's vocabulary, when smaller)
        # and are drawn on the CPU: they become a Python list at once.
        self.random = RandomSpeculator(self.token_limit, self._new_generator(device="cpu"))
        self.live = LiveFanout()
        self.prefill_chunk_tokens = PREFILL_CHUNK_TOKENS
        self.serve_prefill_tokens = SERVE_PREFILL_TOKENS
        self.idle_prefill_chunk_tokens = IDLE_PREFILL_CHUNK_TOKENS
        # Rounds degraded because the KV pool was full: drafts served by a point-mass backup
        # (the pool held neither the jit draft nor the rest of the prefill), builds skipped.
        self.kv_exhausted_drafts = 0
        self.kv_exhausted_builds = 0
        # Drafts served by a backup because the request's prefill was still being chunked in.
        self.prefill_backup_drafts = 0
        self.last_build_depth = 0  # D of the latest pre-speculation (self-tuned by the target)
        # D the target chose with its latest Step (0: `config.depth`), for every build until
        # the next Step, first rounds after prefill included.
        self.build_depth = 0
        self.build_forwards = 0  # draft forwards of pre-speculation builds (the server resets)
        # Since start, for the speedup model's components (`eval.model_check`): outcomes that
        # had F_k cached branches at their k, those that hit, and builds by tree depth D.
        self.fanout_outcomes: Counter[int] = Counter()
        self.fanout_hits: Counter[int] = Counter()
        self.builds_by_depth: Counter[int] = Counter()

    @property
    def phases(self) -> PhaseTimer:
        """Seconds by phase of this engine's work (the draft model's timer, shared)."""
        return self.model.phases

    # ---------------------------------------------------------------- lifecycle
    @property
    def token_limit(self) -> int:
        """Ids below this are draftable: V, or fewer when the model's vocabulary was cut
        (`--ssd-draft-vocab`, or the target's smaller vocabulary: `draft_vocab.limit`)."""
        vocab = self.model.vocab
        return int(vocab.ids.max()) + 1 if vocab is not None else self.vocab_size

    @property
    def q_columns(self) -> torch.Tensor | None:
        """int64 [W] on the CPU, ascending: the only ids where this engine's q rows can be
        non-zero, the draft vocabulary in force (the runtime gives every other id logit -inf,
        `DraftModel.use_vocab`); None: every id. The link sends q at this width."""
        vocab = self.model.vocab
        return None if vocab is None else vocab.ids

    def _new_generator(
        self, seed: int | None = None, device: torch.device | str | None = None
    ) -> torch.Generator:
        """A draft RNG seeded from `seed` (or the engine's seed source), on `device` (default:
        where the model's logits are sampled, `generator_device`)."""
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
        where = generator_device(self.model.device) if device is None else torch.device(device)
        return torch.Generator(device=where).manual_seed(seed ^ 0x5D2A_9E37)

    def open(
        self,
        rid: str,
        token_ids: Sequence[int],
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int | None = None,
        prefill: bool = True,
        first_round: bool = False,
    ) -> None:
        """Start tracking a request whose tokens except the last (the root) are to be prefilled.

        With `prefill` they are fed now, as far as the KV pool allows; without (the server),
        chunk by chunk by `advance_prefill` and `serve`. With `first_round`, the round after
        prefill is pre-speculated once the prefill is done by `advance_prefill`, unless an
        outcome arrives first. Re-opening a known rid replaces it. Raises ValueError on an empty
        token list or a token outside the vocabulary.
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
            generator=self._new_generator(None if seed is None else request_seed(seed, rid)),
            slots=empty_slots(self.model.kv_pool.device),
            first_round=first_round,
            features=TargetFeatures() if self.model.uses_features else None,
        )
        self.requests[rid] = state
        if prefill:
            self._prefill([state], state.backlog)

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

    def stats(self) -> SpeculatorStats:
        """The engine's counters for `/ssd/stats` (`SpeculatorStats` says what each is); the
        Steps' totals are the server's (`SpeculatorServer.stats`) and stay 0 here."""
        # Imported here: the engine imports without msgspec (the GPU device check runs it
        # where only torch is installed: tests/test_gpu_collection.py).
        from sglang_ssd.transport.messages import SpeculatorStats

        cache, vocab = self.cache, self.model.vocab
        return SpeculatorStats(
            cache_hits=cache.stats["hits"],
            cache_misses=cache.stats["misses"],
            cache_evicted_requests=cache.stats["evicted_requests"],
            cache_truncated_entries=cache.stats["truncated_entries"],
            kv_slots_used=self.num_used_slots(),
            kv_slots_total=self.model.kv_pool.num_slots,
            open_requests=len(self.requests),
            prefilling_requests=sum(not s.prefilled for s in self.requests.values()),
            cache_entries=cache.num_entries,
            hit_exponent=self.hit_exponent,
            kv_exhausted=self.kv_exhausted_drafts + self.kv_exhausted_builds,
            kv_exhausted_drafts=self.kv_exhausted_drafts,
            kv_exhausted_builds=self.kv_exhausted_builds,
            prefill_backup_drafts=self.prefill_backup_drafts,
            draft_vocab_size=vocab.size if vocab is not None else self.vocab_size,
            build_tree_depth=self.last_build_depth,
            fanout_outcomes=dict(sorted(self.fanout_outcomes.items())),
            fanout_hits=dict(sorted(self.fanout_hits.items())),
            builds_at_depth=dict(sorted(self.builds_by_depth.items())),
        )

    # ---------------------------------------------------------------- outcomes
    def apply_outcomes(self, outcomes: Sequence[OutcomeIn]) -> list[str]:
        """Commit each verified outcome; a cached branch for it becomes the next draft. Each
        applied outcome (k of its draft's tokens accepted) also feeds the α of the fan-out.

        Returns:
            The rids whose outcome could not be applied (unknown rid, k larger than the
            outstanding draft, token outside the vocabulary); the caller treats them as missing.
        """
        with self.phases.phase("lookup"):
            return self._apply_outcomes(outcomes)

    def _apply_outcomes(self, outcomes: Sequence[OutcomeIn]) -> list[str]:
        failed = []
        for o in outcomes:
            state = self.requests.get(o.rid)
            depth = state.draft.depth if state is not None and state.draft is not None else 0
            if (
                state is None
                or not 0 <= o.accept_len <= depth
                or not all(0 <= t < self.vocab_size for t in (o.bonus, *o.extra))
            ):
                logger.warning("speculator: cannot apply outcome %s (draft depth %d)", o, depth)
                if state is not None:
                    self.close(o.rid)
                failed.append(o.rid)
                continue
            self._apply_one(state, o.accept_len, o.bonus)
            if o.extra:
                self._append_plain(state, o.extra)
        return failed

    def _apply_one(self, state: RequestState, k: int, bonus: int) -> None:
        draft = state.draft
        drafted = draft.tokens[:k] if draft is not None else []
        if draft is not None:  # α for the geometric fan-out, from k of the draft's depth
            self.live.observe_accepted(k, draft.depth)
            self.live.observe_outcome(draft, state.is_greedy, k, bonus)
        n_old = len(state.committed)
        state.committed = state.committed + drafted + [bonus]
        state.first_round = False
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
        fanout = branches.ks.count(k)
        self.live.observe_hit(fanout, hit)
        self.fanout_outcomes[fanout] += 1
        self.fanout_hits[fanout] += hit
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
                source=draft_kinds.CACHE,
                probs=None if branches.probs is None else branches.probs[row],
                token_probs=None if branches.token_probs is None else branches.token_probs[row],
            )
        else:
            self.model.kv_pool.free(branches.slots.reshape(-1))
        self.cache.remove(state.rid)

    def add_features(self, rid: str, start: int, features: torch.Tensor) -> bool:
        """The target's features [n, F] of `rid`'s committed positions start .. start + n − 1
        (after the outcome that committed them is applied). Rows already fed that read the
        head's own hidden where these features now stand are marked for `refresh_features`.

        Returns:
            False (nothing kept) for an unknown rid, a draft that reads no features, or
            features that leave a gap or go past the committed tokens.
        """
        state = self.requests.get(rid)
        if state is None or state.features is None:
            return False
        if start + features.shape[0] > len(state.committed):
            logger.warning("speculator: features of %s past its committed tokens", rid)
            return False
        try:
            first = state.features.add(start, features)
        except ValueError as exc:
            logger.warning("speculator: features of %s dropped: %s", rid, exc)
            return False
        if first is not None and first < state.num_fed:
            # Row `first` now writes fc(f_first) for the row after it, which read the head's
            # own hidden of row `first` instead: both are recomputed.
            state.stale_from = first if state.stale_from is None else min(state.stale_from, first)
        return True

    def refresh_features(self) -> int:
        """Recompute, in one forward, the fed committed rows of every request marked stale by
        `add_features`, in place (same slots), so later rows attend to K/V built from the
        target's features (EAGLE-3: the draft re-reads verified positions with their real
        features); drafted rows after them keep theirs. Trims the features fed for good.
        Returns the rows recomputed."""
        segments, touched = [], []
        for s in self.requests.values():
            if s.stale_from is None:
                continue
            lo, hi = s.stale_from, min(s.num_fed, len(s.committed))
            s.stale_from = None
            if hi > lo:
                tokens = torch.tensor(s.committed[lo:hi], dtype=torch.int64)
                seg = causal_segment(s.slots[:lo], tokens, lo, s.slots[lo:hi])
                segments.append(seg.with_features(s.features))
            touched.append(s)
        rows = sum(int(seg.tokens.numel()) for seg in segments)
        if segments:
            packed = pack(segments, self.model.device)
            run_packed(self.model, packed, "refresh", logits_rows=torch.zeros(1, dtype=torch.int64))
        for s in touched:
            s.trim_fed_features()
        return rows

    def _append_plain(self, state: RequestState, tokens: Sequence[int]) -> None:
        """Commit tokens of plain rounds (the target decoded them without a draft): a draft the
        cache had for the round after the outcome is stale, and so are the K/V slots of its
        tokens; the new tokens are fed by the next draft's forward (`serve`)."""
        committed = len(state.committed)
        self.model.kv_pool.free(state.slots[committed:])
        state.slots = state.slots[:committed]
        state.draft = None
        state.committed = state.committed + [int(t) for t in tokens]

    def _unfeed_root(self, state: RequestState) -> None:
        root = len(state.committed) - 1
        self.model.kv_pool.free(state.slots[root:])
        state.slots = state.slots[:root]

    def _drop_branches(self, state: RequestState) -> None:
        if state.branches is not None:
            self.model.kv_pool.free(state.branches.slots.reshape(-1))
            state.branches = None

    # ---------------------------------------------------------------- serving
    def serve(
        self, rids: Sequence[str], backup: str, depth: int, feed_all: bool = False
    ) -> list[Draft | None]:
        """The draft of each request: its cache hit, else the backup (`jit`, `ngram`, `random`).

        Requests with a short backlog (at most `serve_prefill_tokens` unfed tokens; with a
        feature-reading runtime, one chunk of any backlog; with `feed_all`, all of it) are fed
        first; those still prefilling a longer one, and those whose jit draft the KV pool
        cannot hold, get an n-gram draft (or the point-mass backup the target chose).

        Args:
            rids: requests that need a draft for this round, in batch order.
            backup: the fallback the target chose for this batch (Theorem 17).
            depth: D for backup drafts (γ).
            feed_all: feed every backlog now (a sync round: the target waits for this draft
                on every core, and its verify stops the speculator, so no prefill would go on
                between rounds).

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
            # Catch-up feeds only (a miss's unfed accepted tokens): a prompt still prefilling
            # gets a backup draft now, its prefill going on between rounds. A runtime that reads
            # the target's features gets a prompt's features with its first Step (nothing could
            # feed it before), and its forwards are cheap: it gets one chunk now.
            fed, budget = need, self.prefill_chunk_tokens
            if feed_all:
                budget = max(budget, sum(s.feedable for s in need))
            elif not self.model.uses_features:
                fed = [s for s in need if s.feedable <= self.serve_prefill_tokens]
            self._prefill(fed, budget)
            ready = [s for s in need if s.prefilled]
            pool_full = self._pool_free() == 0  # else the chunk's budget ran out first
            for s in need:
                if not s.prefilled:
                    self._degrade(s, backup, depth, pool_full)
            if not draft_kinds.kind(backup).point_mass:
                # A jit draft feeds the unfed committed tokens (the root) and d_1 .. d_{D-1}.
                needs = [len(s.committed) - s.num_fed + depth - 1 for s in ready]
                fits = admit(needs, self._pool_free())
                for s, ok in zip(ready, fits, strict=True):
                    if not ok:
                        self._degrade(s, backup, depth, pool_full=True)
                jit = [s for s, ok in zip(ready, fits, strict=True) if ok]
                if jit:
                    self._jit(jit, depth, self.plan(), saguaro=self.config.mode != "sync")
            else:
                for s in ready:
                    self._point_mass(s, backup, depth)
        return [None if s is None else s.draft for s in states]

    def _pool_free(self) -> int:
        return self.model.kv_pool.num_free

    def _degrade(self, state: RequestState, backup: str, depth: int, pool_full: bool) -> None:
        """A point-mass draft for a request the model cannot draft this round (counted)."""
        if not draft_kinds.kind(backup).point_mass:
            backup = draft_kinds.fast_backup_names()[0]  # n-gram: the first fast backup
        self._point_mass(state, backup, depth)
        if pool_full:
            self.kv_exhausted_drafts += 1
        else:
            self.prefill_backup_drafts += 1

    def _point_mass(self, state: RequestState, backup: str, depth: int) -> None:
        proposer = {"ngram": self.ngram, "random": self.random}[draft_kinds.kind(backup).proposer]
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
        probs: list[list[torch.Tensor]] = [[] for _ in states]
        token_probs: list[list[torch.Tensor]] = [[] for _ in states]
        for j in range(depth):
            if j == 0:
                logits = feed_committed(
                    self.model, states, [len(s.committed) - s.num_fed for s in states], "jit"
                )
            else:
                logits = feed_tokens(self.model, states, [t[-1] for t in tokens], "jit")
            with self.phases.phase("sampling"):
                sample = sample_drafts(logits, states, [top_m[j]] * len(states), beta, num_cand)
            for i in range(len(states)):
                tokens[i].append(int(sample.tokens[i]))
                qs[i].append(sample.q[i])
                cands[i].append(sample.candidates[i])
                probs[i].append(sample.probs[i])
                token_probs[i].append(sample.token_probs[i])
        for i, s in enumerate(states):
            s.draft = Draft(
                tokens=tokens[i],
                q=None if s.is_greedy else torch.stack(qs[i]),  # type: ignore[arg-type]
                candidates=pad_rows(cands[i] + [torch.empty(0, dtype=torch.int64)], num_cand),
                source=draft_kinds.JIT,
                probs=pad_rows(probs[i] + [torch.empty(0)], num_cand, 0.0),
                token_probs=torch.stack(token_probs[i]) if depth else torch.empty(0),
            )

    # ---------------------------------------------------------------- prefill
    def _prefill(self, states: Sequence[RequestState], budget: int) -> list[RequestState]:
        """Feed at most `budget` tokens (and what the pool holds) of the states' backlogs in one
        forward, shortest backlog first (so a long prompt holds up as few requests as possible);
        returns the states whose prefill this completed."""
        pending = sorted((s for s in states if s.feedable > 0), key=lambda s: s.feedable)
        if not pending:
            return []
        counts = prefill_plan([s.feedable for s in pending], budget, self._pool_free())
        feed_committed(self.model, pending, counts)
        return [s for s, n in zip(pending, counts, strict=True) if n and s.prefilled]

    def prefill_pending(self) -> bool:
        """Whether `advance_prefill` can make progress now (a backlog, and free KV slots)."""
        return self._pool_free() > 0 and any(s.feedable for s in self.requests.values())

    def advance_prefill(self) -> None:
        """Feed one chunk of pending prefill (at most `idle_prefill_chunk_tokens`); requests
        opened with `first_round` whose prefill this completes get their first round
        pre-speculated."""
        done = self._prefill(list(self.requests.values()), self.idle_prefill_chunk_tokens)
        first = [s.rid for s in done if s.first_round and s.draft is None]
        if first:
            self.prespeculate_first_rounds(first)

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

    def prespeculate_first_round(self, rid: str) -> None:
        """Pre-speculate the round after prefill: the target has not sampled the first token
        yet, so the outstanding "draft" is empty and every branch forks at k = 0 from the
        draft's top candidates for that token (the first Step's outcome is (0, t_1))."""
        self.prespeculate_first_rounds([rid])

    def prespeculate_first_rounds(self, rids: Sequence[str]) -> None:
        """`prespeculate_first_round` for several prefilled requests in one build."""
        todo = []
        for rid in rids:
            state = self.requests.get(rid)
            if state is None or state.draft is not None or not state.prefilled:
                continue
            state.first_round = False
            state.draft = Draft(tokens=[], q=None, candidates=None, source="prefill")
            todo.append(rid)
        if todo:
            self.build(todo)

    def build(self, rids: Sequence[str], depth: int | None = None) -> None:
        """Pre-speculate the next round for `rids` (glue, fork, tree decode, populate).

        `depth` is D, the tokens decoded per branch, 1..γ (None or 0: `build_depth`, the
        target's latest choice, else the configured `config.depth`). Requests still prefilling
        are skipped, and so (counted) are those whose glue and branches the KV pool cannot hold:
        their next round misses the cache.

        Raises:
            ValueError: `depth` outside 0..γ.
        """
        if depth is not None and not 0 <= depth <= self.config.lookahead:
            raise ValueError(f"tree depth must be in 0..γ={self.config.lookahead}, got {depth}")
        depth = depth or self.build_depth or self.config.depth
        states = [s for r in rids if (s := self.requests.get(r)) is not None and s.draft]
        states = [s for s in states if s.branches is None and s.prefilled]
        if not states or self.config.fanout_budget == 0:
            return
        plan = self.plan()
        needs = [
            len(s.sequence) - s.num_fed + sum(plan.fanout(s.draft.depth)) * depth for s in states
        ]
        fits = admit(needs, self._pool_free())
        self.kv_exhausted_builds += fits.count(False)
        states = [s for s, ok in zip(states, fits, strict=True) if ok]
        if states:
            before = self.model.forward_count
            prespeculate(self.model, self.cache, states, plan, self.config.beta, depth)
            self.build_forwards += self.model.forward_count - before
            self.last_build_depth = depth
            self.builds_by_depth[depth] += 1

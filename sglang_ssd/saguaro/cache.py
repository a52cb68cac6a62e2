"""The speculation cache: (request, accepted length k, bonus token) -> the next round's draft.

While the target verifies round T, the speculator pre-speculates round T + 1 for the likeliest
outcomes v = (k, t*) and stores each branch's D draft tokens with the q rows they were sampled from
(paper section 4.1; docs/design.md#the-speculation-cache). q may be stored densely [N, D, V] or
sparsely as
`SparseProbs` (top-K-truncated): exact as long as it is the distribution actually sampled from.
Entries are a dict per request, so a lookup costs one dict probe per request; the last round's
entries of a request are replaced by its next round as a whole.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SparseProbs:
    """A distribution stored as its support: indices int64 [..., K], values float [..., K].

    Indices in one row must be distinct; rows may be padded with (index 0, value 0).
    """

    indices: torch.Tensor
    values: torch.Tensor

    def __post_init__(self) -> None:
        if self.indices.shape != self.values.shape or self.indices.dtype != torch.int64:
            raise ValueError("SparseProbs needs int64 indices and values of the same shape")
        if not self.values.dtype.is_floating_point:
            raise ValueError("SparseProbs values must be floating point")

    def to_dense(self, vocab_size: int) -> torch.Tensor:
        """Dense [..., V] in the values' dtype (no cast), zeros off the support."""
        out = self.values.new_zeros((*self.values.shape[:-1], vocab_size))
        return out.scatter_add_(-1, self.indices, self.values)

    def __getitem__(self, item: object) -> SparseProbs:
        return SparseProbs(self.indices[item], self.values[item])

    @property
    def nbytes(self) -> int:
        return _nbytes(self.indices) + _nbytes(self.values)


Probs = torch.Tensor | SparseProbs


@dataclass
class _Round:
    index: dict[tuple[int, int], int]  # (k, bonus) -> row
    tokens: torch.Tensor  # int64 [N, D]
    probs: Probs | None  # [N, D, V] or SparseProbs [N, D, K]; None: point-mass drafts
    nbytes: int


@dataclass(frozen=True)
class CacheLookup:
    """Result of `SpeculationCache.lookup` for B requests.

    Attributes:
        hit: bool [B].
        draft_tokens: int64 [B, D], -1 on misses.
        point_mass: bool [B], True for hits whose drafts were stored without q.
        vocab_size: V.
        rows: int64 [B] (CPU), the hit's row in the order its round was populated, -1 on
            misses; lets a caller keep per-branch data (e.g. KV slots) beside the cache.
    """

    hit: torch.Tensor
    draft_tokens: torch.Tensor
    point_mass: torch.Tensor
    vocab_size: int
    _probs: tuple[Probs | None, ...]
    rows: torch.Tensor | None = None

    def dense_probs(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """float [B, D, V] q rows for `verify`; zeros for misses and point-mass hits.

        The stored dtype is kept (all hits must share it, else ValueError); `dtype` is only used
        when no hit carries q (default float32).
        """
        batch, depth = self.draft_tokens.shape
        dtypes = {
            p.dtype if isinstance(p, torch.Tensor) else p.values.dtype
            for p in self._probs
            if p is not None
        }
        if len(dtypes) > 1:
            raise ValueError(f"cached q rows have mixed dtypes {dtypes}")
        out_dtype = dtypes.pop() if dtypes else (dtype or torch.float32)
        out = torch.zeros(
            batch, depth, self.vocab_size, dtype=out_dtype, device=self.draft_tokens.device
        )
        sparse = [(i, p) for i, p in enumerate(self._probs) if isinstance(p, SparseProbs)]
        for i, p in enumerate(self._probs):
            if isinstance(p, torch.Tensor):
                out[i] = p
        if sparse:
            width = max(p.indices.shape[-1] for _, p in sparse)
            rows = torch.tensor([i for i, _ in sparse], device=out.device)
            idx = torch.stack([_pad(p.indices, width) for _, p in sparse])
            val = torch.stack([_pad(p.values, width) for _, p in sparse])
            out[rows] = SparseProbs(idx, val).to_dense(self.vocab_size)
        return out


class SpeculationCache:
    """Bounded map (request id, k, bonus token) -> next draft tokens [D] and their q [D, V].

    Bounds: at most `max_entries` (k, bonus) entries and `max_bytes` bytes of stored tensors over
    all requests. When `populate` would exceed them, whole requests are evicted, least recently
    populated or hit first (never the request being populated); a round that alone exceeds the
    bounds keeps only its first entries (callers list branches most likely first). The cache keeps
    references to the tensors it is given (no copy, except when truncating a round).

    Source: paper section 4.1 (speculation cache); docs/design.md#the-speculation-cache.
    """

    def __init__(
        self,
        vocab_size: int,
        max_entries: int = 1 << 16,
        max_bytes: int = 1 << 31,
        device: torch.device | str = "cpu",
    ) -> None:
        """Raises ValueError on vocab_size < 1 or non-positive bounds."""
        if vocab_size < 1 or max_entries < 1 or max_bytes < 1:
            raise ValueError("vocab_size, max_entries and max_bytes must be >= 1")
        self.vocab_size = int(vocab_size)
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self.device = torch.device(device)
        self._rounds: OrderedDict[Hashable, _Round] = OrderedDict()
        self.num_entries = 0
        self.nbytes = 0
        self.stats = {"hits": 0, "misses": 0, "evicted_requests": 0, "truncated_entries": 0}

    def __len__(self) -> int:
        return len(self._rounds)

    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._rounds

    def populate(
        self,
        request_id: Hashable,
        accept_lens: torch.Tensor | Sequence[int],
        bonus_tokens: torch.Tensor | Sequence[int],
        draft_tokens: torch.Tensor,
        draft_probs: Probs | None = None,
    ) -> None:
        """Store a request's pre-speculated branches, replacing its previous round.

        Args:
            request_id: any hashable id.
            accept_lens: int [N], the outcome's accepted length k for each branch.
            bonus_tokens: int [N], the outcome's bonus token t* for each branch.
            draft_tokens: int64 [N, D], the branch's next D draft tokens.
            draft_probs: float [N, D, V] or SparseProbs [N, D, K]: the exact q each draft token
                was sampled from; None for point-mass drafts.

        Raises:
            ValueError: on shape/dtype mismatch, tokens outside [0, V) or duplicate keys.
        """
        ks = _as_list(accept_lens)
        bonus = _as_list(bonus_tokens)
        n = len(ks)
        if len(bonus) != n or draft_tokens.dim() != 2 or draft_tokens.shape[0] != n:
            raise ValueError(
                f"need accept_lens [N], bonus_tokens [N], draft_tokens [N, D]; got "
                f"{n}, {len(bonus)}, {tuple(draft_tokens.shape)}"
            )
        if draft_tokens.dtype != torch.int64:
            raise ValueError(f"draft_tokens must be int64, got {draft_tokens.dtype}")
        if any(not 0 <= t < self.vocab_size for t in bonus):
            raise ValueError(f"bonus tokens must lie in [0, {self.vocab_size})")
        self._check_probs(draft_probs, draft_tokens.shape)
        index = {key: row for row, key in enumerate(zip(ks, bonus, strict=True))}
        if len(index) != n:
            raise ValueError(f"duplicate (k, bonus) keys for request {request_id!r}")
        self.remove(request_id)
        nbytes = _nbytes(draft_tokens) + _probs_nbytes(draft_probs)
        fit = min(n, self.max_entries, n if nbytes == 0 else self.max_bytes * n // nbytes)
        if fit < n:
            self.stats["truncated_entries"] += n - fit
            draft_tokens = draft_tokens[:fit].clone()
            if draft_probs is not None:
                draft_probs = _clone_probs(draft_probs[:fit])
            index = {key: row for key, row in index.items() if row < fit}
            nbytes = _nbytes(draft_tokens) + _probs_nbytes(draft_probs)
        if fit == 0:
            return
        while self._rounds and (
            self.num_entries + fit > self.max_entries or self.nbytes + nbytes > self.max_bytes
        ):
            self._drop(next(iter(self._rounds)))
            self.stats["evicted_requests"] += 1
        self._rounds[request_id] = _Round(index, draft_tokens, draft_probs, nbytes)
        self.num_entries += fit
        self.nbytes += nbytes

    def lookup(
        self,
        request_ids: Sequence[Hashable],
        accept_lens: torch.Tensor | Sequence[int],
        bonus_tokens: torch.Tensor | Sequence[int],
        depth: int | None = None,
    ) -> CacheLookup:
        """Find each request's verified outcome (k, t*) in the cache.

        Args:
            request_ids: B ids. accept_lens: int [B], k. bonus_tokens: int [B], t*.
            depth: draft length D to return; a hit needs a stored draft of >= D tokens and is
                cut to D (a prefix of a draft, with its q rows, is itself exact). None: the
                stored D of the hits (which must agree), 0 if nothing hits.

        Returns:
            CacheLookup on the stored tensors' device (the cache's `device` if nothing hits).

        Raises:
            ValueError: on length mismatch, or disagreeing stored depths with depth=None.
        """
        ks, bonus = _as_list(accept_lens), _as_list(bonus_tokens)
        if not len(request_ids) == len(ks) == len(bonus):
            raise ValueError("request_ids, accept_lens and bonus_tokens must have equal length")
        found: list[tuple[_Round, int] | None] = []
        for rid, k, t in zip(request_ids, ks, bonus, strict=True):
            entry = self._rounds.get(rid)
            row = None if entry is None else entry.index.get((k, t))
            if row is not None and depth is not None and entry.tokens.shape[1] < depth:
                row = None
            found.append(None if row is None else (entry, row))
            if row is not None:
                self._rounds.move_to_end(rid)
        hits = [f for f in found if f is not None]
        self.stats["hits"] += len(hits)
        self.stats["misses"] += len(found) - len(hits)
        if depth is None:
            depths = {entry.tokens.shape[1] for entry, _ in hits}
            if len(depths) > 1:
                raise ValueError(f"cached drafts have different depths {depths}; pass depth")
            depth = depths.pop() if depths else 0
        device = hits[0][0].tokens.device if hits else self.device
        tokens = torch.full((len(found), depth), -1, dtype=torch.int64, device=device)
        probs: list[Probs | None] = []
        for i, f in enumerate(found):
            if f is None:
                probs.append(None)
                continue
            entry, row = f
            tokens[i] = entry.tokens[row, :depth]
            probs.append(None if entry.probs is None else entry.probs[row][:depth])
        hit = torch.tensor([f is not None for f in found], dtype=torch.bool, device=device)
        point_mass = torch.tensor(
            [f is not None and f[0].probs is None for f in found], dtype=torch.bool, device=device
        )
        rows = torch.tensor([-1 if f is None else f[1] for f in found], dtype=torch.int64)
        return CacheLookup(hit, tokens, point_mass, self.vocab_size, tuple(probs), rows)

    def remove(self, request_id: Hashable) -> bool:
        """Forget a request (abort or finish); True if it had entries."""
        if request_id not in self._rounds:
            return False
        self._drop(request_id)
        return True

    def clear(self) -> None:
        self._rounds.clear()
        self.num_entries = 0
        self.nbytes = 0

    def _drop(self, request_id: Hashable) -> None:
        entry = self._rounds.pop(request_id)
        self.num_entries -= len(entry.index)
        self.nbytes -= entry.nbytes

    def _check_probs(self, probs: Probs | None, token_shape: torch.Size) -> None:
        if probs is None:
            return
        if isinstance(probs, SparseProbs):
            if tuple(probs.indices.shape[:-1]) != tuple(token_shape):
                raise ValueError(
                    f"SparseProbs must be [N, D, K] with [N, D] = "
                    f"{tuple(token_shape)}, got {tuple(probs.indices.shape)}"
                )
            return
        if not isinstance(probs, torch.Tensor) or not probs.dtype.is_floating_point:
            raise ValueError("draft_probs must be a float tensor, SparseProbs or None")
        if tuple(probs.shape) != (*token_shape, self.vocab_size):
            raise ValueError(
                f"draft_probs must be [N, D, V] = {(*token_shape, self.vocab_size)},"
                f" got {tuple(probs.shape)}"
            )


def _as_list(values: torch.Tensor | Sequence[int]) -> list[int]:
    if isinstance(values, torch.Tensor):
        return [int(v) for v in values.reshape(-1).tolist()]
    return [int(v) for v in values]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _probs_nbytes(probs: Probs | None) -> int:
    if probs is None:
        return 0
    return probs.nbytes if isinstance(probs, SparseProbs) else _nbytes(probs)


def _clone_probs(probs: Probs) -> Probs:
    if isinstance(probs, SparseProbs):
        return SparseProbs(probs.indices.clone(), probs.values.clone())
    return probs.clone()


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, width - t.shape[-1]))

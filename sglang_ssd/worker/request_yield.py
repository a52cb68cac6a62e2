"""What one request's speculative rounds yield, by kind: `RequestYield`, kept on the request.

A pre-speculated (async) round of request r commits L_hit(r) tokens when the speculation cache
holds its outcome and L_miss(r) when the backup drafts it, so it yields
h(r)·L_hit(r) + (1 − h(r))·L_miss(r) tokens, h(r) the request's own cache hit rate; a sync round
(a just-in-time chain from the draft model, `sync_rounds`) yields L_sync(r). Text decides which
is larger: on the 2-core AMX Xeon code hit the cache (pre-speculation 9.34 against sync rounds'
8.08 tok/s) while chat missed it, and its n-gram-drafted misses accepted 1.97 tokens where a
just-in-time chain accepted 3.2 (sync rounds 5.68 against 5.08 tok/s; docs/benchmarks.md, "Sync
rounds"). `SyncRoundPolicy` weighs these per request instead of one average per batch size.

Tokens are k + 1 per round (bonus included), moving averages of weight `REQUEST_EMA_WEIGHT`,
each counted after `MIN_REQUEST_ROUNDS` rounds of its kind (the figures `round_mode` uses for
L_r).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_ssd.saguaro.averages import Ema
from sglang_ssd.worker.round_mode import MIN_REQUEST_ROUNDS, REQUEST_EMA_WEIGHT

_REQ_ATTR = "ssd_round_yield"


def _ema() -> Ema:
    return Ema(REQUEST_EMA_WEIGHT)


@dataclass
class RequestYield:
    """One request's measured yield per kind of speculative round (module docstring).

    Attributes:
        hit: the cache hit indicator (1 or 0) of its async rounds: its moving average is h(r).
        hit_tokens: tokens (k + 1) of its async rounds that hit the cache.
        miss_tokens: tokens of its async rounds drafted by the backup.
        sync_tokens: tokens of its sync rounds.
    """

    hit: Ema = field(default_factory=_ema)
    hit_tokens: Ema = field(default_factory=_ema)
    miss_tokens: Ema = field(default_factory=_ema)
    sync_tokens: Ema = field(default_factory=_ema)

    def observe(self, sync: bool, hit: bool, tokens: int) -> None:
        """Fold in one measured round: its kind, whether it hit the cache (async only) and the
        tokens it committed (k + 1 >= 1).

        Raises:
            ValueError: on fewer than 1 token.
        """
        if tokens < 1:
            raise ValueError(f"a round commits at least 1 token (the bonus), got {tokens}")
        if sync:
            self.sync_tokens.add(float(tokens))
            return
        self.hit.add(1.0 if hit else 0.0)
        (self.hit_tokens if hit else self.miss_tokens).add(float(tokens))

    def expected(self, sync: bool) -> float | None:
        """Expected tokens per round of kind `sync` for this request (>= 1), or None before
        `MIN_REQUEST_ROUNDS` rounds of that kind were measured."""
        if sync:
            ema = self.sync_tokens
            return ema.value if ema.count >= MIN_REQUEST_ROUNDS else None
        if self.hit.count < MIN_REQUEST_ROUNDS or self.hit.value is None:
            return None
        h = self.hit.value  # > 0 only after a hit, < 1 only after a miss: both averages exist
        hits = h * self.hit_tokens.value if self.hit_tokens.value is not None else 0.0
        misses = (1 - h) * self.miss_tokens.value if self.miss_tokens.value is not None else 0.0
        return hits + misses


def request_yield(req: object) -> RequestYield | None:
    """The yield kept on `req` (an SGLang `Req`), None before its first measured round."""
    return getattr(req, _REQ_ATTR, None)


def record_request_round(req: object, sync: bool, hit: bool, tokens: int) -> None:
    """Fold one measured speculative round of `req` into its `RequestYield`
    (`RequestYield.observe`; created on the first)."""
    got = request_yield(req)
    if got is None:
        got = RequestYield()
        setattr(req, _REQ_ATTR, got)
    got.observe(sync, hit, tokens)

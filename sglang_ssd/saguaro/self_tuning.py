"""Self-tuning of the tree depth D: pre-speculate only as deep as the verify can hide.

Saguaro's principle is that a bigger cache is worth it only while building it stays hidden behind
the target's verify (paper §4; DESIGN.md §1, "Speedup model"). The speculator builds a round's
cache with 1 + D draft forwards (glue, then one per tree depth), so its time grows with D while a
hit's accept length E(α, D) (bonus included) saturates. Each round `DepthTuner.choose` picks the
D in 1..γ that maximises the speedup model with the live measurements:

    speed(D) = [p E(α, D) + (1 - p) E(α_miss, γ)] / [p_b h(D) + (1 - p_b) (T_b + h(D))]
    h(D) = max(T_verify, T_p(D)),   T_p(D) = t_fixed + (1 + D) t_forward,   p_b = p^b

(`expected_speedup` with the hit lookahead D). t_forward and t_fixed come from the speculator's
per-round phases (`observe_build`); α from the hits' accepted tokens (`observe_hits`), as the
maximum-likelihood per-token acceptance of a geometric truncated at each draft's depth, so drafts
of different depths pool into one estimate. A D given with `--ssd-tree-depth` or through
`POST /ssd/config` pins it (`pinned`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .speedup import expected_speedup

# Forward bodies in a Step's phases: the build's glue and tree_* forwards, and the others
# (prefill, just-in-time drafts) that share the LM head and sampling phases with them.
BUILD_BODIES = ("glue",)
OTHER_BODIES = ("prefill", "jit")
# Per-forward costs recorded apart from the bodies, shared in proportion to body time.
HEAD_PHASES = ("lm_head", "sampling")
# Build phases paid once per round whatever D is.
FIXED_PHASES = ("populate",)
# A new D must beat the current one's modelled speed by this factor (no flapping on noise).
SWITCH_MARGIN = 1.03
# Weight of one round in the moving averages of the timings and of α's counts.
EMA_WEIGHT = 0.2
# α is estimated from (accepted, tried) counts; these pseudo-counts set its prior (0.8).
PRIOR_ACCEPTED, PRIOR_TRIED = 4.0, 5.0


@dataclass
class DepthTuner:
    """Chooses D each round from the live timings, acceptance and hit rate.

    Attributes:
        lookahead: γ >= 1; D ranges over 1..γ.
        pinned: a fixed D (from the flag or the admin endpoint), or None to self-tune.
        depth: the D in force (the last choice, or `pinned`).
        t_forward: seconds per draft forward (moving average), None before the first build.
        t_fixed: seconds of a build outside its forwards (moving average).
        accepted, tried: decayed counts behind α (draft tokens accepted / tried by verify).
    """

    lookahead: int
    pinned: int | None = None
    depth: int = 0
    t_forward: float | None = None
    t_fixed: float = 0.0
    accepted: float = PRIOR_ACCEPTED
    tried: float = PRIOR_TRIED

    def __post_init__(self) -> None:
        if int(self.lookahead) != self.lookahead or self.lookahead < 1:
            raise ValueError(f"lookahead must be an int >= 1, got {self.lookahead}")
        self.pin(self.pinned)

    def pin(self, depth: int | None) -> None:
        """Pin D to `depth` (1..γ), or None to self-tune again (from γ).

        Raises:
            ValueError: when `depth` is outside 1..γ.
        """
        if depth is not None and not 1 <= int(depth) <= self.lookahead:
            raise ValueError(f"tree depth must be in 1..γ={self.lookahead}, got {depth}")
        self.pinned = None if depth is None else int(depth)
        self.depth = self.pinned if self.pinned is not None else (self.depth or self.lookahead)

    @property
    def alpha(self) -> float:
        """Per-token acceptance of cached drafts, in (0, 1)."""
        return self.accepted / self.tried

    def observe_hits(self, accept_lens: Iterable[int], depths: Iterable[int]) -> None:
        """Fold in one round's cache hits: k accepted of a draft of `depth` tokens each.

        A hit with k < depth tried k + 1 tokens (the last rejected), one with k = depth tried
        `depth`, all accepted: the MLE of a geometric truncated at each depth is Σk / Σtried.
        """
        accepted = tried = 0
        for k, d in zip(accept_lens, depths, strict=True):
            if d < 1 or not 0 <= k <= d:
                continue
            accepted += k
            tried += k + (1 if k < d else 0)
        if tried:
            keep = 1.0 - EMA_WEIGHT
            self.accepted = keep * self.accepted + accepted
            self.tried = keep * self.tried + tried

    def observe_build(self, phases: Mapping[str, float], depth: int) -> None:
        """Fold in one build's phases (seconds by name, as `SpeculatorTiming.phases` carries
        them) that decoded `depth` tree depths; a Step without a build is ignored.

        Forward time is the glue and every ``tree_*`` body, plus their share (by body time) of
        the LM head and sampling, which the Step's prefill and just-in-time forwards also
        record, over 1 + depth forwards; `FIXED_PHASES` are once per build.
        """
        trees = sum(v for k, v in phases.items() if k.startswith("tree_"))
        if depth < 1 or trees <= 0.0:
            return
        built = trees + sum(phases.get(k, 0.0) for k in BUILD_BODIES)
        bodies = built + sum(phases.get(k, 0.0) for k in OTHER_BODIES)
        head = sum(phases.get(k, 0.0) for k in HEAD_PHASES)
        per_forward = built * (1.0 + head / bodies) / (1 + depth)
        fixed = sum(phases.get(k, 0.0) for k in FIXED_PHASES)
        if self.t_forward is None:
            self.t_forward, self.t_fixed = per_forward, fixed
            return
        self.t_forward += EMA_WEIGHT * (per_forward - self.t_forward)
        self.t_fixed += EMA_WEIGHT * (fixed - self.t_fixed)

    def build_time(self, depth: int) -> float:
        """T_p(D) = t_fixed + (1 + D) t_forward in seconds (0 before any build was seen)."""
        if self.t_forward is None:
            return 0.0
        return self.t_fixed + (1 + depth) * self.t_forward

    def speed(
        self,
        depth: int,
        *,
        t_verify: float,
        p_hit: float,
        alpha_miss: float,
        t_backup: float,
        batch_size: int,
    ) -> float:
        """Modelled tokens per request per verify time with D = `depth` (module docstring).

        Args:
            depth: D in 1..γ.
            t_verify: the target's verify forward, seconds (> 0).
            p_hit: live cache hit rate in [0, 1].
            alpha_miss: per-token acceptance of the backup drafts served on a miss.
            t_backup: the backup's latency on a miss, seconds.
            batch_size: b >= 1.

        Source: paper Theorem 7 with DESIGN.md §1's corrections (`expected_speedup`).
        """
        return expected_speedup(
            alpha_hit=min(max(self.alpha, 0.0), 1.0),
            alpha_miss=alpha_miss,
            lookahead=self.lookahead,
            hit_lookahead=depth,
            p_hit=p_hit,
            t_spec=self.build_time(depth) / t_verify,
            t_backup=t_backup / t_verify,
            batch_size=batch_size,
        )

    def choose(
        self,
        *,
        t_verify: float,
        p_hit: float,
        alpha_miss: float,
        t_backup: float,
        batch_size: int,
    ) -> int:
        """D for the next build: `pinned`, else the modelled best (kept unless another D is
        `SWITCH_MARGIN` faster); γ until a build has been timed. Arguments as in `speed`."""
        if self.pinned is not None or self.t_forward is None:
            return self.depth
        if not (math.isfinite(t_verify) and t_verify > 0):
            return self.depth
        kwargs = dict(
            t_verify=t_verify,
            p_hit=p_hit,
            alpha_miss=alpha_miss,
            t_backup=t_backup,
            batch_size=batch_size,
        )
        speeds = {d: self.speed(d, **kwargs) for d in range(1, self.lookahead + 1)}
        best = max(speeds, key=lambda d: (speeds[d], d))
        if speeds[best] > SWITCH_MARGIN * speeds[self.depth]:
            self.depth = best
        return self.depth

    def stats(self) -> dict[str, float]:
        """`/ssd/stats` entries: the D in force, whether it is pinned, and the model's inputs."""
        return {
            "tree_depth": float(self.depth),
            "tree_depth_pinned": float(self.pinned is not None),
            "tuner_alpha": self.alpha,
            "tuner_t_forward_s": self.t_forward or 0.0,
            "tuner_t_fixed_s": self.t_fixed,
        }

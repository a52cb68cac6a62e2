"""Self-tuning of the tree depth D: pre-speculate only as deep as the verify can hide.

Saguaro's principle is that a bigger cache is worth it only while building it stays hidden behind
the target's verify (paper §4; docs/design.md#speedup-model-theorem-7). The speculator builds a
round's
cache with 1 + D draft forwards (glue, then one per tree depth), so its time grows with D while a
hit's accept length E(α, D) (bonus included) saturates. Each round `DepthTuner.choose` picks the
D in 1..γ that maximises the speedup model with the live measurements:

    speed(D) = [p E(α, D) + (1 - p) E(α_miss, γ)] / [p_b h(D) + (1 - p_b) (T_b + h(D))]
    h(D) = max(T_verify, T_p(D)),   T_p(D) = t_fixed + (1 + D) t_forward,   p_b = p^b

(`expected_speedup` with the hit lookahead D). t_forward and t_fixed come from the speculator's
per-round phases and forward counts (`observe_build`); α from the hits' accepted tokens
(`observe_hits`, `AcceptanceCounts`: drafts of different depths pool into one estimate). A D
given with `--ssd-tree-depth` or through `POST /ssd/config` pins it (`pinned`; 0 self-tunes
again). The model holds p_hit fixed across D; a shallower draft has fewer fork points, each
with more of the budget, so it hits somewhat more often than modelled: the choice leans deep.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .acceptance import AcceptanceCounts
from .averages import ema
from .speedup import expected_speedup

# The build's forward bodies in a Step's phases (with every ``tree_*``).
BUILD_BODIES = ("glue",)
# Costs of every forward (prefill and just-in-time ones too) recorded apart from the bodies. The
# LM head streams its whole weight for any row count, so it costs about the same per forward.
HEAD_PHASES = ("lm_head", "sampling")
# Build phases paid once per round whatever D is.
FIXED_PHASES = ("populate",)
# A new D must beat the current one's modelled speed by this factor (no flapping on noise).
SWITCH_MARGIN = 1.03
# Weight of one round in the moving averages of the timings.
EMA_WEIGHT = 0.2


def forward_seconds(phases: Mapping[str, float], forwards: float, build_forwards: float) -> float:
    """Seconds per draft forward of a build: (glue + tree bodies) / `build_forwards` + (LM head +
    sampling) / `forwards`, from the speculator's seconds by phase over the same span.

    Raises:
        ZeroDivisionError: when `build_forwards` or `forwards` is 0 (the callers check first).
    """
    trees = sum(v for k, v in phases.items() if k.startswith("tree_"))
    built = trees + sum(phases.get(k, 0.0) for k in BUILD_BODIES)
    head = sum(phases.get(k, 0.0) for k in HEAD_PHASES)
    return built / build_forwards + head / forwards


@dataclass
class DepthTuner:
    """Chooses D each round from the live timings, acceptance and hit rate.

    Attributes:
        lookahead: γ >= 1; D ranges over 1..γ.
        pinned: a fixed D (from the flag or the admin endpoint), or None to self-tune.
        depth: the D in force (the last choice, or `pinned`).
        t_forward: seconds per draft forward (moving average), None before the first build.
        t_fixed: seconds of a build outside its forwards (moving average).
        acceptance: the cache hits' per-token acceptance counts (α).
    """

    lookahead: int
    pinned: int | None = None
    depth: int = 0
    t_forward: float | None = None
    t_fixed: float = 0.0
    acceptance: AcceptanceCounts = field(default_factory=AcceptanceCounts)

    def __post_init__(self) -> None:
        if int(self.lookahead) != self.lookahead or self.lookahead < 1:
            raise ValueError(f"lookahead must be an int >= 1, got {self.lookahead}")
        self.pin(self.pinned)

    def pin(self, depth: int | None) -> None:
        """Pin D to `depth` (1..γ), or None / 0 to self-tune again (from the D in force).

        Raises:
            ValueError: when `depth` is outside 0..γ.
        """
        if depth is not None and not 0 <= int(depth) <= self.lookahead:
            raise ValueError(f"tree depth must be in 1..γ={self.lookahead}, got {depth}")
        self.pinned = int(depth) if depth else None
        self.depth = self.pinned if self.pinned is not None else (self.depth or self.lookahead)

    @property
    def alpha(self) -> float:
        """Per-token acceptance of cached drafts, in [0, 1]."""
        return self.acceptance.alpha

    def observe_hits(self, accept_lens: Iterable[int], depths: Iterable[int]) -> None:
        """Fold in one round's cache hits: k accepted of a draft of `depth` tokens each."""
        self.acceptance.observe(accept_lens, depths)

    def observe_build(
        self, phases: Mapping[str, float], forwards: int, build_forwards: int
    ) -> None:
        """Fold in the speculator's work since its previous Drafts (`SpeculatorTiming`):
        `phases` in seconds by name, `forwards` draft forwards in all, `build_forwards` of them
        pre-speculation's (glue and tree depths, of one or more builds); nothing without a build.

        t_forward = (glue + tree bodies) / build_forwards + (LM head + sampling) / forwards;
        `FIXED_PHASES` are once per build.
        """
        if build_forwards < 1 or forwards < build_forwards:
            return
        per_forward = forward_seconds(phases, forwards, build_forwards)
        fixed = sum(phases.get(k, 0.0) for k in FIXED_PHASES)
        if self.t_forward is None:
            self.t_forward, self.t_fixed = per_forward, fixed
            return
        self.t_forward = ema(self.t_forward, per_forward, EMA_WEIGHT)
        self.t_fixed = ema(self.t_fixed, fixed, EMA_WEIGHT)

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

        Source: paper Theorem 7 with docs/design.md#speedup-model-theorem-7 corrections
        (`expected_speedup`).
        """
        return expected_speedup(
            alpha_hit=self.alpha,
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

    def stats(self) -> dict[str, float | int | bool]:
        """`/ssd/stats` entries: the D in force, whether it is pinned, and the model's inputs
        (α, seconds of one forward and of the fixed part of a round)."""
        return {
            "tree_depth": self.depth,
            "tree_depth_pinned": self.pinned is not None,
            "tuner_alpha": self.alpha,
            "tuner_t_forward_s": self.t_forward or 0.0,
            "tuner_t_fixed_s": self.t_fixed,
        }

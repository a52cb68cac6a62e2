"""Which draft to use on a cache miss, per batch (paper Theorem 17;
docs/design.md#fallback-theorem-17).

The target-side worker knows the batch, so it runs this policy and sends the choice to the
speculator. Below b* the primary draft runs just-in-time (slow, accurate); at b >= b* a fast backup
(n-gram over the request's own tokens, or random tokens) wins, because the whole batch waits for
its slowest miss: with x_b = 1 - p_hit^b the chance that a round waits for a backup, each option's
speed is N_X / (h + x_b T_X) (`expected_speedup`), and "fast X beats JIT" is linear in x_b, so the
set of batch sizes where it wins is a threshold b >= b*_X.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from .acceptance import alpha_from_accept_length, expected_accept_length
from .averages import ema
from .draft_kinds import JIT, backup_names, fast_backup_names
from .speedup import expected_speedup

# Draft source on a cache miss (`--ssd-backup`): one member per speculator kind of
# `draft_kinds.KINDS` (JIT: the primary draft just in time; NGRAM, RANDOM: point-mass drafts).
Backup = enum.Enum(  # type: ignore[misc]
    "Backup", {name.upper().replace("-", "_"): name for name in backup_names()}, type=str
)
Backup.__doc__ = "Draft source on a cache miss (`--ssd-backup`); see `draft_kinds.KINDS`."
JIT_BACKUP = Backup(JIT)


@dataclass
class BackupStats:
    """Measured quality and cost of one miss option.

    Attributes:
        alpha: per-token acceptance of its drafts, in [0, 1] (`alpha_from_accept_length`).
        latency: time to produce one draft of gamma tokens on a miss, in the same unit as
            `FallbackPolicy.t_verify` (e.g. seconds).
        accept_length: the average of its rounds' accept lengths (tokens per request per
            round, bonus included; None before one was measured), `alpha` being E^-1 of it.
            Averaging each round's own alpha instead is biased low (E^-1 is concave): at batch
            1 a just-in-time draft's rounds accept all or nothing (alpha 1 or 0), and five of
            them with 2.6 tokens on average gave alpha 0.4 where E^-1(2.6) is 0.65.
        observations: rounds measured so far (0: `alpha` and `latency` are a starting guess).
            `FallbackPolicy.observe` counts the guess as one round and averages it evenly with
            the first rounds until a round would weigh less than `ema_weight`: an option the
            policy does not choose is measured only now and then (a new request's first round
            drafts just in time), and a moving average at weight 0.1 kept the 0.5 s guess for
            the just-in-time draft near 0.45 s on a CPU that drafted it in 0.22 s, so batch 1
            took the n-gram backup on misses. (Letting the first round replace the guess was
            tried: the server's startup warm-up, one round on a 6-token prompt, then set the
            n-gram backup's alpha to 0.)
    """

    alpha: float
    latency: float
    observations: int = 0
    accept_length: float | None = None


@dataclass
class FallbackPolicy:
    """Picks the miss option per batch by maximising `expected_speedup` (Theorem 17).

    Attributes:
        lookahead: gamma >= 1.
        p_hit: per-request cache hit rate in [0, 1].
        alpha_hit: per-token acceptance of cached (primary, Saguaro-sampled) drafts.
        t_verify: one target verify (> 0), e.g. seconds; every time below uses this unit.
        t_spec: the speculator's time to build the next cache (T_p before dividing by t_verify).
        backups: the available miss options and their stats; JIT's latency is the primary
            draft's gamma forwards.
        mode: "auto" (maximise the model) or a `Backup` value forcing it (`--ssd-backup`).
        batch_threshold_override: b* fixed by `--ssd-batch-threshold` (auto mode only): JIT below
            it, the faster-by-model fast backup at or above it.
        ema_weight: weight in (0, 1] of a new observation in `observe`'s moving averages.

    Raises:
        ValueError: on out-of-range values, an unknown mode, or a mode/override whose options
            are missing from `backups`.
    """

    lookahead: int
    p_hit: float
    alpha_hit: float
    t_verify: float
    t_spec: float
    backups: dict[Backup, BackupStats] = field(default_factory=dict)
    mode: Backup | str = "auto"
    batch_threshold_override: int | None = None
    ema_weight: float = 0.1

    def __post_init__(self) -> None:
        if self.mode != "auto":
            try:
                self.mode = Backup(self.mode)
            except ValueError as err:
                known = "|".join(("auto", *backup_names()))
                raise ValueError(f"mode must be {known}, got {self.mode!r}") from err
        self.backups = {Backup(key): value for key, value in self.backups.items()}
        if int(self.lookahead) != self.lookahead or self.lookahead < 1:
            raise ValueError(f"lookahead must be an int >= 1, got {self.lookahead}")
        if not 0.0 < self.ema_weight <= 1.0:
            raise ValueError(f"ema_weight must be in (0, 1], got {self.ema_weight}")
        if not (math.isfinite(self.t_verify) and self.t_verify > 0):
            raise ValueError(f"t_verify must be > 0, got {self.t_verify}")
        _check_unit("p_hit", self.p_hit)
        _check_unit("alpha_hit", self.alpha_hit)
        _check_time("t_spec", self.t_spec)
        for key, stats in self.backups.items():
            _check_unit(f"backups[{key.value}].alpha", stats.alpha)
            _check_time(f"backups[{key.value}].latency", stats.latency)
        if self.mode == "auto":
            if not self.backups:
                raise ValueError("auto mode needs stats for at least one backup option")
            if self.batch_threshold_override is not None:
                if int(self.batch_threshold_override) < 1:
                    raise ValueError("batch_threshold_override must be >= 1")
                if JIT_BACKUP not in self.backups or not self._fast_options():
                    raise ValueError("a batch threshold needs stats for jit and a fast backup")

    def speedup(self, backup: Backup, batch_size: int) -> float:
        """Model tokens per request per verify time if misses use `backup` (Theorem 7).

        Raises:
            KeyError: if `backup` has no stats. ValueError: if batch_size < 1.
        """
        stats = self.backups[Backup(backup)]
        return expected_speedup(
            alpha_hit=self.alpha_hit,
            alpha_miss=stats.alpha,
            lookahead=self.lookahead,
            p_hit=self.p_hit,
            t_spec=self.t_spec / self.t_verify,
            t_backup=stats.latency / self.t_verify,
            batch_size=batch_size,
        )

    def choose(self, batch_size: int) -> Backup:
        """The miss option for a batch of `batch_size` requests (ties go to JIT).

        Args:
            batch_size: b >= 1, requests in the batch being verified.

        Returns:
            The forced `mode`, or JIT below a fixed threshold and the fast backup the model
            prefers at or above it, or (auto) the option maximising `speedup(option, b)`.

        Raises:
            ValueError: if batch_size < 1.

        Source: paper Theorem 17; docs/design.md#who-decides-the-fallback.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self.mode != "auto":
            return Backup(self.mode)
        if self.batch_threshold_override is not None:
            if batch_size < self.batch_threshold_override:
                return JIT_BACKUP
            return max(self._fast_options(), key=lambda b: self.speedup(b, batch_size))
        options = list(self.backups)  # dict order; JIT first in Backup order on ties
        options.sort(key=lambda b: list(Backup).index(b))
        return max(options, key=lambda b: self.speedup(b, batch_size))

    def batch_threshold(self) -> int | None:
        """b*: the smallest batch size at which `choose` leaves JIT; None if it never does.

        Solved in closed form per fast option X from N_X (h + x T_J) > N_J (h + x T_X), linear
        in x = 1 - p_hit^b (h = max(1, T_p)), then checked against `choose`. A forced fast mode
        gives 1, forced JIT None, a fixed `batch_threshold_override` itself.

        Returns:
            int b* >= 1 (fast backups win for every b >= b*), or None.

        Source: paper Theorem 17 with the speedup model of docs/design.md#speedup-model-theorem-7.
        """
        if self.mode != "auto":
            return None if self.mode == JIT_BACKUP else 1
        if self.batch_threshold_override is not None:
            return int(self.batch_threshold_override)
        if JIT_BACKUP not in self.backups:
            return 1
        candidates = [b for b in map(self._threshold_against_jit, self._fast_options()) if b]
        return min(candidates) if candidates else None

    def observe(
        self,
        *,
        hit_rate: float | None = None,
        accept_length_hit: float | None = None,
        t_verify: float | None = None,
        t_spec: float | None = None,
        backup: Backup | None = None,
        accept_length_backup: float | None = None,
        t_backup: float | None = None,
    ) -> None:
        """Fold one round's measurements into the moving averages (weight `ema_weight`; a miss
        option's starting guess and first rounds are averaged evenly, `BackupStats.observations`,
        and its accept lengths are averaged before alpha is solved from them).

        Args:
            hit_rate: fraction of the batch's requests that hit (1.0 / 0.0 for one request).
            accept_length_hit: mean tokens per round (bonus included) of hit requests,
                converted to alpha by `alpha_from_accept_length` before averaging.
            t_verify, t_spec: measured times (same unit as the fields).
            backup, accept_length_backup, t_backup: a miss option's measured accept length and
                latency; `backup` is required with either. An option without stats yet needs
                both, and is added.

        Raises:
            ValueError: on out-of-range measurements or a missing `backup`.
        """
        w = self.ema_weight

        if hit_rate is not None:
            _check_unit("hit_rate", hit_rate)
            self.p_hit = ema(self.p_hit, hit_rate, w)
        if accept_length_hit is not None:
            self.alpha_hit = ema(
                self.alpha_hit, alpha_from_accept_length(accept_length_hit, self.lookahead), w
            )
        if t_verify is not None:
            if not t_verify > 0:
                raise ValueError(f"t_verify must be > 0, got {t_verify}")
            self.t_verify = ema(self.t_verify, t_verify, w)
        if t_spec is not None:
            _check_time("t_spec", t_spec)
            self.t_spec = ema(self.t_spec, t_spec, w)
        if accept_length_backup is not None or t_backup is not None:
            if backup is None:
                raise ValueError("observe: backup is required with its measurements")
            key = Backup(backup)
            alpha = (
                None
                if accept_length_backup is None
                else alpha_from_accept_length(accept_length_backup, self.lookahead)
            )
            stats = self.backups.get(key)
            if stats is None:  # no guess: the first round is the estimate
                if alpha is None or t_backup is None:
                    raise ValueError(f"first observation of {key.value} needs both measurements")
                _check_time("t_backup", t_backup)
                self.backups[key] = BackupStats(
                    alpha=alpha, latency=t_backup, observations=1,
                    accept_length=accept_length_backup,
                )  # fmt: skip
                return
            if t_backup is not None:
                _check_time("t_backup", t_backup)
            stats.observations += 1
            # The guess (or the first round) weighs as one round: an even average, then the
            # moving average once a round would weigh less than w.
            wb = max(w, 1.0 / (stats.observations + 1))
            if accept_length_backup is not None:
                held = stats.accept_length
                if held is None:  # a guess: its accept length
                    held = expected_accept_length(stats.alpha, self.lookahead)
                stats.accept_length = ema(held, accept_length_backup, wb)
                stats.alpha = alpha_from_accept_length(stats.accept_length, self.lookahead)
            if t_backup is not None:
                stats.latency = ema(stats.latency, t_backup, wb)

    def _fast_options(self) -> list[Backup]:
        return [b for b in map(Backup, fast_backup_names()) if b in self.backups]

    def _threshold_against_jit(self, fast: Backup) -> int | None:
        def wins(batch: int) -> bool:
            return self.speedup(fast, batch) > self.speedup(JIT_BACKUP, batch)

        if wins(1):
            return 1
        hidden = max(1.0, self.t_spec / self.t_verify)
        n_fast, n_jit = self.speedup(fast, 1), self.speedup(JIT_BACKUP, 1)
        x1 = 1.0 - self.p_hit
        n_fast *= hidden + x1 * self.backups[fast].latency / self.t_verify
        n_jit *= hidden + x1 * self.backups[JIT_BACKUP].latency / self.t_verify
        t_fast = self.backups[fast].latency / self.t_verify
        t_jit = self.backups[JIT_BACKUP].latency / self.t_verify
        slope = n_fast * t_jit - n_jit * t_fast
        if slope <= 0 or not 0.0 < self.p_hit < 1.0:
            return None  # fast cannot overtake as x grows, or x_b does not depend on b
        x_star = hidden * (n_jit - n_fast) / slope
        if x_star >= 1.0:
            return None
        batch = max(1, math.floor(math.log1p(-x_star) / math.log(self.p_hit)) + 1)
        while batch > 1 and wins(batch - 1):  # guard float rounding at the boundary
            batch -= 1
        for _ in range(64):
            if wins(batch):
                return batch
            batch += 1
        return None


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def _check_time(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be a finite time >= 0, got {value}")

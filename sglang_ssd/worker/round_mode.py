"""Speculate this decode round, or run a plain one: `RoundModePolicy` (`--ssd-plain-rounds`).

A plain round verifies no draft: one TARGET_VERIFY position per request (its root), the bonus
token sampled from p (exact: Theorem 1 with an empty draft), while the speculator is stopped and
its cores are lent to the target (`sglang_ssd.worker.core_lending`). So a plain round runs at
plain decoding's speed on all the machine's cores: on a 2-core CPU the target alone on both
cores decodes ~1.7x faster than on its own core, so speculation pays only while it yields more
than ~1.7x the tokens per round time.

The choice is measured, not modelled. Per batch size b the policy keeps moving averages of the
wall time of speculative and plain rounds (t_spec(b), t_plain(b); before plain rounds were
measured, t_plain(b) = `plain_prior` x t_spec(b)). Each request brings its own accept length
L_r (tokens per speculative round, bonus included, a moving average kept by the worker on the
request): the batch speculates while mean(L_r) / t_spec(b) beats 1 / t_plain(b) (with a
margin against flapping). A request whose L_r is not known yet counts with L(b), the mean
accept length of recent speculative rounds at the nearest measured batch size, so a batch of
newcomers is judged at once (on a fresh server, before any speculative round, it speculates to
measure). A batch size with no round of a mode measured within a factor 2 of it runs that
mode to measure it (a speculative round first, then one plain round): at b = 4 and 8 on the
2-core EPYC a plain round took 0.28-0.3 of a speculative one (0.27 s against 0.9 s; 0.45 s
against 1.6 s), far from a fixed prior's guess, and a round at batch 1 says little about one at
batch 4. Each mode's first round since start is not measured (one-time costs: the startup
warm-up's speculative round took 1.8 s at batch 1, later ones 0.45 s). While plain rounds are
in use, speculation is re-probed for a few rounds at intervals that double while plain keeps
winning (exponential backoff), since the requests' text may turn more predictable. A batch where
no request has more than one token left to generate is always plain: no draft token could be
used.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sglang_ssd.config import PLAIN_ROUNDS
from sglang_ssd.saguaro.averages import Ema
from sglang_ssd.worker.probes import ProbeSchedule


def plain_rounds_refusal(setting: str, target_device: str) -> str | None:
    """Why `--ssd-plain-rounds setting` cannot serve a target on `target_device`, or None.

    Off the CPU a plain round's TARGET_VERIFY forward has one query row per request, while
    SGLang's CUDA attention backends build verify metadata for the static width
    `speculative_num_draft_tokens` (γ + 1): FA3, the default on Hopper, sets `cu_seqlens_q` in
    steps of it (sglang/srt/layers/attention/flashattention_backend.py,
    `init_forward_metadata`, target verify with topk <= 1), so rows would be read out of bounds
    or attend to another request's KV. Only "never" is served there.
    """
    if setting == "never" or str(target_device).startswith("cpu"):
        return None
    return (
        f"--ssd-plain-rounds {setting} is not supported on {target_device}: a plain round "
        "verifies one position per request, and SGLang's CUDA attention backends (FA3) build "
        "the verify metadata for γ + 1 positions; use never"
    )


class RoundMode(str, enum.Enum):
    """What a decode round does."""

    SPECULATE = "speculate"
    PLAIN = "plain"


@dataclass
class RoundModePolicy:
    """Chooses each decode round's `RoundMode` from measured rates (module docstring).

    Attributes:
        setting: "auto" (measure and choose), "never" (always speculate), "always" (always plain).
        ema_weight: weight in (0, 1] of a new round time in the moving averages.
        plain_prior: t_plain(b) / t_spec(b) assumed before a plain round at b was measured
            (0.5: 2-core decode against a 1-core verify on this project's CPUs).
        probes: speculative probes while plain rounds are in use (4 rounds each, after 16 to
            256 plain rounds: the interval doubles each time a probe confirms plain rounds and
            starts again at 16 when speculation takes over).
        probe_share: probes take at most this share of the plain rounds' time between them:
            at least probe rounds x t_spec(b) / (probe_share x t_plain(b)) plain rounds pass
            between probes (a speculative round at b = 4 and 8 cost 3-3.5 plain ones on the
            2-core EPYC, so 16 plain rounds between 4-round probes spent half the time in them).
        margin: the other mode must be rated this factor faster to take over (≥ 1). A switch
            costs more than the rates show (the first speculative round after plain ones drafts
            just in time, and the pre-speculation built meanwhile is lost): with 1.05, mixed
            traffic ran 0.95x AR against 1.03x for plain SSD, so the default is 1.3.

    Raises:
        ValueError: on an unknown setting or out-of-range parameters.
    """

    setting: str = "auto"
    ema_weight: float = 0.3
    plain_prior: float = 0.5
    probes: ProbeSchedule = field(default_factory=ProbeSchedule)
    probe_share: float = 0.2
    margin: float = 1.3
    _times: dict[RoundMode, dict[int, Ema]] = field(init=False)
    _accept: dict[int, Ema] = field(init=False)
    _current: RoundMode = field(init=False, default=RoundMode.SPECULATE)
    rounds: dict[RoundMode, int] = field(init=False)

    def __post_init__(self) -> None:
        if self.setting not in PLAIN_ROUNDS:
            raise ValueError(f"setting must be one of {PLAIN_ROUNDS}, got {self.setting!r}")
        if not 0.0 < self.ema_weight <= 1.0 or not self.plain_prior > 0.0:
            raise ValueError("ema_weight must be in (0, 1] and plain_prior > 0")
        if not 0.0 < self.probe_share <= 1.0:
            raise ValueError(f"probe_share must be in (0, 1], got {self.probe_share}")
        if self.margin < 1.0:
            raise ValueError(f"margin must be >= 1, got {self.margin}")
        self._times = {mode: {} for mode in RoundMode}
        self._accept = {}
        self.rounds = {mode: 0 for mode in RoundMode}

    # ------------------------------------------------------------------ choice
    def choose(
        self,
        tokens_left: Sequence[int],
        accept_lengths: Sequence[float | None],
    ) -> RoundMode:
        """The mode of the next decode round.

        Args:
            tokens_left: per request, tokens it may still generate (max_new_tokens minus its
                output so far); a round where every entry is <= 1 is plain (unless "never").
            accept_lengths: per request, its L_r (tokens per speculative round, >= 1), None
                while unknown.

        Raises:
            ValueError: on an empty batch or lists of different lengths.
        """
        if not tokens_left or len(tokens_left) != len(accept_lengths):
            raise ValueError("choose needs one tokens_left and accept length per request")
        if self.setting != "auto":
            mode = RoundMode.PLAIN if self.setting == "always" else RoundMode.SPECULATE
        elif max(tokens_left) <= 1:
            mode = RoundMode.PLAIN
        else:
            mode = self._auto(accept_lengths)
        self.rounds[mode] += 1
        return mode

    def _auto(self, accept_lengths: Sequence[float | None]) -> RoundMode:
        if self.probes.probing():
            return RoundMode.SPECULATE
        batch_size = len(accept_lengths)
        recent = nearest_average(self._accept, batch_size)
        if recent is None and None in accept_lengths:
            return RoundMode.SPECULATE  # nothing measured yet: measure the newcomers
        if self._time(RoundMode.SPECULATE, batch_size, max_ratio=2.0) is None:
            return RoundMode.SPECULATE  # measure t_spec near this batch size
        if self._time(RoundMode.PLAIN, batch_size, max_ratio=2.0) is None:
            return RoundMode.PLAIN  # one plain round measures t_plain near this batch size
        known = [recent if x is None else x for x in accept_lengths]
        preferred = self.preferred(batch_size, sum(known) / batch_size)
        if preferred != self._current:
            self._current = preferred
            self.probes.changed(reset_backoff=preferred == RoundMode.SPECULATE)
        if self._current == RoundMode.SPECULATE:
            return RoundMode.SPECULATE
        # Plain held: probe speculation, then wait longer.
        if self.probes.due(self._probe_spacing(batch_size)):
            return RoundMode.SPECULATE
        return RoundMode.PLAIN

    def _probe_spacing(self, batch_size: int) -> int:
        """Plain rounds at `batch_size` between probes for them to take at most `probe_share`
        of the time (0 before both round times are measured)."""
        spec = self._time(RoundMode.SPECULATE, batch_size)
        plain = self._time(RoundMode.PLAIN, batch_size)
        if spec is None or plain is None:  # `observe` keeps every time > 0
            return 0
        return math.ceil(self.probes.rounds * spec / (self.probe_share * plain))

    def preferred(self, batch_size: int, accept_length: float) -> RoundMode:
        """The mode rated faster for `batch_size` requests whose mean L_r is `accept_length`;
        the mode in use keeps its place unless the other is `margin` times faster, and with no
        speculative round measured yet it is speculation."""
        spec = self.rate(RoundMode.SPECULATE, batch_size, accept_length)
        plain = self.rate(RoundMode.PLAIN, batch_size)
        if spec is None or plain is None:
            return RoundMode.SPECULATE
        if self._current == RoundMode.SPECULATE:
            return RoundMode.PLAIN if plain > self.margin * spec else RoundMode.SPECULATE
        return RoundMode.SPECULATE if spec > self.margin * plain else RoundMode.PLAIN

    @property
    def plain_now(self) -> bool:
        """Whether plain rounds are the mode in use ("always", or "auto" that chose them): then
        prefill forwards borrow the speculator's cores too."""
        return self.setting == "always" or (
            self.setting == "auto" and self._current == RoundMode.PLAIN
        )

    def rate(self, mode: RoundMode, batch_size: int, accept_length: float = 1.0) -> float | None:
        """Tokens per request per second of `mode` at `batch_size` (the nearest measured size),
        a speculative round yielding `accept_length` tokens per request; None before the round
        times it needs were measured."""
        t = self._time(mode, batch_size)
        if t is None and mode == RoundMode.PLAIN:
            spec = self._time(RoundMode.SPECULATE, batch_size)
            t = None if spec is None else self.plain_prior * spec
        if t is None or t <= 0:
            return None
        return (accept_length if mode == RoundMode.SPECULATE else 1.0) / t

    def _time(self, mode: RoundMode, batch_size: int, max_ratio: float = math.inf) -> float | None:
        """t_mode at the nearest measured batch size within `max_ratio` of `batch_size`."""
        return nearest_average(self._times[mode], batch_size, max_ratio)

    # ------------------------------------------------------------------ measurements
    def observe(self, mode: RoundMode, batch_size: int, round_s: float) -> None:
        """Fold in one finished round's wall time (the caller skips a speculative round right
        after plain rounds: it pays the switch, a cold speculation cache).

        Args:
            mode: what the round did.
            batch_size: its b >= 1.
            round_s: its wall time in seconds (> 0), scheduler time between rounds included.

        Raises:
            ValueError: on a non-positive time or batch size.
        """
        if batch_size < 1 or not (math.isfinite(round_s) and round_s > 0):
            raise ValueError(f"need batch_size >= 1 and round_s > 0, got {batch_size}, {round_s}")
        self._times[mode].setdefault(batch_size, Ema(self.ema_weight)).add(round_s)

    def observe_accept(self, batch_size: int, mean_tokens: float) -> None:
        """Fold in one speculative round's mean tokens per request (k + 1, bonus included) at
        `batch_size`: L(b), what a request with no L_r of its own is assumed to accept.

        Raises:
            ValueError: on a batch size < 1 or a mean below 1 token.
        """
        if batch_size < 1 or not mean_tokens >= 1.0:
            raise ValueError(f"need batch_size >= 1 and mean_tokens >= 1, got {mean_tokens}")
        self._accept.setdefault(batch_size, Ema(self.ema_weight)).add(mean_tokens)

    def stats(self) -> dict[str, float | int]:
        """For `/ssd/stats`: rounds by mode (counts), the mode in use (1 = plain, 0 =
        speculative) and the measured round times at batch size 1 (seconds; 0 before a
        measurement)."""
        return {
            "plain_rounds": self.rounds[RoundMode.PLAIN],
            "speculative_rounds": self.rounds[RoundMode.SPECULATE],
            "plain_mode": int(self.plain_now),
            "round_s_speculate_b1": self._time(RoundMode.SPECULATE, 1) or 0.0,
            "round_s_plain_b1": self._time(RoundMode.PLAIN, 1) or 0.0,
        }


def nearest_average(
    averages: dict[int, Ema], batch_size: int, max_ratio: float = math.inf
) -> float | None:
    """The average at the measured batch size nearest to `batch_size` (by ratio; the smaller
    on a tie), None when none is measured within `max_ratio` of it."""
    known = {b: e.value for b, e in averages.items() if e.value is not None}
    if not known:
        return None
    nearest = min(known, key=lambda b: (abs(math.log(b / batch_size)), b))
    if abs(math.log(nearest / batch_size)) > math.log(max_ratio):
        return None
    return known[nearest]


# Each request's L_r lives on its SGLang `Req` under this attribute (an `Ema` of tokens per
# speculative round), so it leaves with the request.
_REQ_ATTR = "ssd_accept_length"
REQUEST_EMA_WEIGHT = 0.3
MIN_REQUEST_ROUNDS = 8  # speculative rounds measured before a request's L_r counts


def request_accept_length(req: object) -> float | None:
    """The request's L_r, or None before `MIN_REQUEST_ROUNDS` measured speculative rounds."""
    ema = getattr(req, _REQ_ATTR, None)
    return ema.value if ema is not None and ema.count >= MIN_REQUEST_ROUNDS else None


def record_request_tokens(req: object, tokens: int) -> None:
    """Fold one speculative round's committed tokens (k + 1) into the request's L_r."""
    ema = getattr(req, _REQ_ATTR, None)
    if ema is None:
        ema = Ema(REQUEST_EMA_WEIGHT)
        setattr(req, _REQ_ATTR, ema)
    ema.add(float(tokens))

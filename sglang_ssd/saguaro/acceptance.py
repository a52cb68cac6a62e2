"""Per-token acceptance alpha and the expected accept length E(alpha) of one round.

With i.i.d. per-token acceptance alpha and lookahead gamma, tokens emitted per round (bonus
included) have mean E(alpha) = sum_{i=0}^{gamma} alpha^i = (1 - alpha^(gamma+1)) / (1 - alpha)
(Leviathan et al. 2023; docs/design.md#accept-length-and-alpha). The formulas of the Saguaro pieces
need alpha, found
by solving E(alpha) = L for a measured accept length L, which is not (L - 1) / gamma.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


def expected_accept_length(alpha: float, lookahead: int) -> float:
    """E(alpha) = (1 - alpha^(gamma+1)) / (1 - alpha): mean tokens per round, bonus included.

    Args:
        alpha: per-token acceptance probability in [0, 1].
        lookahead: gamma >= 0 draft tokens per round.

    Returns:
        float in [1, gamma + 1] (tokens per round); gamma + 1 at alpha = 1.

    Raises:
        ValueError: if alpha is outside [0, 1] or lookahead < 0.

    Source: docs/design.md#accept-length-and-alpha; Leviathan et al. 2023, equation (1).
    """
    _check_alpha(alpha)
    if int(lookahead) != lookahead or lookahead < 0:
        raise ValueError(f"lookahead must be an int >= 0, got {lookahead}")
    return float(sum(alpha**i for i in range(int(lookahead) + 1)))


def alpha_from_accept_length(accept_length: float, lookahead: int, tol: float = 1e-12) -> float:
    """Solve E(alpha) = L for alpha by bisection (E is strictly increasing on [0, 1]).

    Args:
        accept_length: L, measured mean tokens per round with the bonus, in [1, gamma + 1]
            (values within 1e-9 outside are clamped, for rounding in measured means).
        lookahead: gamma >= 1.
        tol: bisection tolerance on alpha.

    Returns:
        alpha in [0, 1]; e.g. L = 4.1 at gamma = 4 gives alpha ~ 0.9 (while (L - 1)/gamma = 0.78).

    Raises:
        ValueError: if L is outside [1, gamma + 1] or not finite, or lookahead < 1.

    Source: docs/design.md#accept-length-and-alpha.
    """
    if int(lookahead) != lookahead or lookahead < 1:
        raise ValueError(f"lookahead must be an int >= 1, got {lookahead}")
    top = lookahead + 1.0
    if not math.isfinite(accept_length) or not 1.0 - 1e-9 <= accept_length <= top + 1e-9:
        raise ValueError(
            f"accept_length must be in [1, {top}] for lookahead {lookahead}, got {accept_length}"
        )
    if accept_length <= 1.0:
        return 0.0
    if accept_length >= top:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if expected_accept_length(mid, lookahead) < accept_length:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha must be a probability in [0, 1], got {alpha!r}")


@dataclass
class AcceptanceCounts:
    """Per-token acceptance α from verified drafts of any depth, as decayed counts.

    A draft of d tokens with k accepted (0 <= k <= d) tried k + 1 tokens when k < d (the last
    one rejected) and d when k = d (all accepted): under i.i.d. acceptance the maximum-likelihood
    α of such truncated geometrics is Σk / Σtried, so drafts of different depths (a self-tuned
    tree depth D next to γ-token backups) pool into one estimate, which inverting a mean accept
    length E(α) = L at one fixed γ cannot do. Each `observe` first decays the old counts by
    1 - `decay` (a moving average over about 1 / decay rounds).

    Attributes:
        accepted, tried: the decayed counts; their initial values are the prior (α = ratio).
        decay: weight in (0, 1] of the old counts dropped per round.

    Raises:
        ValueError: unless 0 <= accepted <= tried and 0 < decay <= 1 (so α stays in [0, 1]).

    Source: docs/design.md#accept-length-and-alpha; the truncated-geometric likelihood.
    """

    accepted: float = 4.0
    tried: float = 5.0
    decay: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.accepted <= self.tried:
            raise ValueError(f"need 0 <= accepted <= tried, got {self.accepted}, {self.tried}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")

    @property
    def alpha(self) -> float:
        """Σ accepted / Σ tried, in [0, 1]."""
        return self.accepted / self.tried if self.tried > 0 else 0.0

    def observe(self, accept_lens: Iterable[int], depths: Iterable[int]) -> None:
        """Fold in one round: k accepted of a draft of d tokens, per request (pairs with
        d < 1 or k outside 0..d are skipped). A round with nothing tried changes nothing."""
        accepted = tried = 0
        for k, d in zip(accept_lens, depths, strict=True):
            if d < 1 or not 0 <= k <= d:
                continue
            accepted += k
            tried += k + (1 if k < d else 0)
        if tried:
            keep = 1.0 - self.decay
            self.accepted = keep * self.accepted + accepted
            self.tried = keep * self.tried + tried

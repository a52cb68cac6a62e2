"""The round's fan-out plan and the live α / r it is computed from (hit-model fit included)."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.saguaro import geometric_fanout, uniform_fanout
from sglang_ssd.speculator.fanout_plan import (
    DEFAULT_HIT_EXPONENT,
    HIT_EXPONENT_RANGE,
    REFIT_EVERY,
    LiveFanout,
)

VOCAB = 128


def _power_law_outcomes(live: LiveFanout, c: float, r: float, n: int, seed: int = 0) -> None:
    """Feed n outcomes at fan-outs 1..8 that hit with probability 1 - c F^-r."""
    gen = torch.Generator().manual_seed(seed)
    fanouts = torch.randint(1, 9, (n,), generator=gen)
    draws = torch.rand(n, generator=gen)
    for f, u in zip(fanouts.tolist(), draws.tolist(), strict=True):
        live.observe_hit(f, u < 1.0 - c * f**-r)


@pytest.mark.parametrize("r", [0.5, 1.2, 2.0])
def test_hit_exponent_is_fitted_from_power_law_outcomes(r: float) -> None:
    live = LiveFanout()
    _power_law_outcomes(live, c=0.6, r=r, n=4096)
    assert live.num_hit_observations == 4096
    assert live.hit_exponent == pytest.approx(r, abs=0.15)


def test_hit_exponent_stays_default_until_enough_data() -> None:
    live = LiveFanout()
    _power_law_outcomes(live, c=0.6, r=1.5, n=REFIT_EVERY - 1)
    assert live.hit_exponent == DEFAULT_HIT_EXPONENT  # no refit yet
    live.refit()
    assert live.hit_exponent != DEFAULT_HIT_EXPONENT
    single = LiveFanout()
    for _ in range(2 * REFIT_EVERY):
        single.observe_hit(3, False)  # one fan-out value: no slope to fit
        single.observe_hit(0, True)  # F = 0 says nothing about r
    assert single.num_hit_observations == 2 * REFIT_EVERY
    assert single.hit_exponent == DEFAULT_HIT_EXPONENT


def test_hit_exponent_is_clamped() -> None:
    live = LiveFanout()
    for _ in range(REFIT_EVERY):
        live.observe_hit(1, True)
        live.observe_hit(8, True)  # every outcome hits: the fitted slope is ~0
    assert live.hit_exponent == HIT_EXPONENT_RANGE[0]


def test_plan_matches_the_saguaro_allocations() -> None:
    live = LiveFanout()
    for _ in range(20):
        live.observe_accepted(2, 4)  # L = 3 tokens of a γ = 4 draft
    alpha = live.alpha()
    assert 0.05 <= alpha <= 0.98
    plan = live.plan(SSDConfig(lookahead=4, fanout_budget=12), VOCAB)
    assert plan.fanout(3) == geometric_fanout(12, 3, alpha, DEFAULT_HIT_EXPONENT, VOCAB)
    assert plan.fanout(3) is plan.fanout(3)  # computed once per depth
    assert plan.top_m(3) == [f + 1 for f in plan.fanout(3)[:-1]]
    assert plan.num_candidates(0) == 13
    uniform = live.plan(SSDConfig(lookahead=4, fanout_budget=7, fanout="uniform"), VOCAB)
    assert uniform.fanout(4) == uniform_fanout(7, 4, VOCAB)

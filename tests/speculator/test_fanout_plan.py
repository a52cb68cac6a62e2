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
from sglang_ssd.speculator.state import Draft, RequestState, empty_slots

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
    plan = live.plan(SSDConfig(lookahead=4, fanout_budget=12, fanout="geometric"), VOCAB)
    assert plan.fanout(3) == geometric_fanout(12, 3, alpha, DEFAULT_HIT_EXPONENT, VOCAB)
    assert plan.fanout(3) is plan.fanout(3)  # computed once per depth
    assert plan.top_m(3) == [f + 1 for f in plan.fanout(3)[:-1]]
    assert plan.num_candidates(0) == 13
    uniform = live.plan(SSDConfig(lookahead=4, fanout_budget=7, fanout="uniform"), VOCAB)
    assert uniform.fanout(4) == uniform_fanout(7, 4, VOCAB)


def _drafting_state(rid: str, token_probs: list[float], greedy: bool = True) -> RequestState:
    """A request whose draft in flight has `token_probs` (d_j is row j-1's top candidate)."""
    depth, width = len(token_probs), 9
    cands = torch.stack([torch.arange(width) + 10 * k for k in range(depth + 1)])
    probs = torch.zeros(depth + 1, width)
    for k in range(depth + 1):
        top = token_probs[k] if k < depth else 0.6
        probs[k] = torch.tensor([top] + [(1 - top) * 0.5**i for i in range(1, width)])
    draft = Draft(
        tokens=cands[:depth, 0].tolist(),
        q=None,
        candidates=cands,
        source="cache",
        probs=probs,
        token_probs=torch.tensor(token_probs),
    )
    temperature, top_k = (0.0, 1) if greedy else (0.7, -1)
    return RequestState(
        rid, [1, 2, 3], temperature, top_k, 1.0, torch.Generator(), empty_slots("cpu"), draft
    )


def test_predicted_plan_allocates_each_draft_its_own_outcomes() -> None:
    live = LiveFanout()
    config = SSDConfig(lookahead=4, fanout_budget=8, fanout="predicted")
    plan = live.plan(config, VOCAB)
    assert plan.num_candidates(4) == 9  # the whole budget may go to one k
    confident = _drafting_state("a", [0.98, 0.98, 0.98, 0.98])
    hesitant = _drafting_state("b", [0.95, 0.2, 0.9, 0.9])
    first_round = _drafting_state("c", [])
    fanouts = plan.fanouts([confident, hesitant, first_round])
    assert [len(f) for f in fanouts] == [5, 5, 1]
    assert sum(map(sum, fanouts)) == 3 * 8  # one budget shared by the batch
    assert max(range(5), key=lambda k: fanouts[0][k]) == 4  # all accepted, most likely
    assert sum(fanouts[1][:2]) > sum(fanouts[1][2:])  # the hesitation at d_2
    geometric = live.plan(SSDConfig(lookahead=4, fanout_budget=8, fanout="geometric"), VOCAB)
    assert geometric.fanouts([confident, hesitant]) == [geometric.fanout(4)] * 2
    # without the candidates' probabilities (no glue yet) the plan falls back to its shape
    hesitant.draft.probs = None
    assert plan.fanouts([confident, hesitant]) == [plan.fanout(4)] * 2


def test_verified_outcomes_calibrate_the_outcome_model() -> None:
    live = LiveFanout()
    state = _drafting_state("a", [0.9, 0.9, 0.9, 0.9])
    config = SSDConfig(lookahead=4, fanout_budget=8, fanout="predicted")
    (before,) = live.plan(config, VOCAB).fanouts([state])
    for _ in range(200):  # the target rejects d_1 every time
        live.observe_outcome(state.draft, state.is_greedy, 0, 1)
    assert live.outcomes.rounds_observed == 0 and len(live.outcomes.pending) == 200
    live.outcomes.flush()  # learnt at the next allocation (`OutcomeModel.defer`)
    assert live.outcomes.rounds_observed == 200
    assert float(live.outcomes.greedy.accept.predict(torch.tensor([0.9]))) < 0.2
    (after,) = live.plan(config, VOCAB).fanouts([state])
    assert after[0] >= 4 > before[0] and after[4] < before[4]  # rows moved to k = 0
    sampled = _drafting_state("s", [0.9], greedy=False)
    live.observe_outcome(sampled.draft, sampled.is_greedy, 1, 10)
    live.plan(config, VOCAB).fanouts([sampled])
    assert float(live.outcomes.sampled.accept.trials.sum()) == 1.0

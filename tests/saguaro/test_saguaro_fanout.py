"""Geometric fan-out (Theorem 12, corrected), the hit model (Def. 11) and E(alpha) = L."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ssd.saguaro import (
    alpha_from_accept_length,
    expected_accept_length,
    fit_hit_counts,
    fit_hit_model,
    geometric_fanout,
    hit_rate,
    uniform_fanout,
)


def real_fanout(budget: int, gamma: int, alpha: float, r: float) -> list[float]:
    """docs/design.md#geometric-fan-out-theorem-12 corrected formula, written as stated there."""
    w = [alpha ** (k / (1 + r)) for k in range(gamma)]
    w.append(alpha ** (gamma / (1 + r)) * (1 - alpha) ** (-1 / (1 + r)))
    f0 = budget / sum(w)
    return [f0 * x for x in w]


@settings(max_examples=300, deadline=None)
@given(
    budget=st.integers(0, 500),
    gamma=st.integers(0, 8),
    alpha=st.floats(0.0, 1.0),
    r=st.floats(0.05, 5.0),
    vocab=st.integers(2, 200),
)
def test_geometric_fanout_invariants(budget, gamma, alpha, r, vocab) -> None:
    fanout = geometric_fanout(budget, gamma, alpha, r, vocab)
    assert len(fanout) == gamma + 1
    assert all(isinstance(f, int) and 0 <= f <= vocab - 1 for f in fanout)
    assert sum(fanout) <= budget
    positive = sum(1 for k in range(gamma + 1) if _outcome_prob(alpha, gamma, k) > 0)
    assert sum(fanout) == min(budget, (vocab - 1) * positive)
    assert all(fanout[k] >= fanout[k + 1] for k in range(gamma - 1))


def _outcome_prob(alpha: float, gamma: int, k: int) -> float:
    return alpha**k * (1 - alpha) if k < gamma else alpha**gamma


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(1, 400),
    gamma=st.integers(1, 8),
    alpha=st.floats(0.01, 0.99),
    r=st.floats(0.1, 4.0),
)
def test_geometric_fanout_rounds_the_corrected_formula(budget, gamma, alpha, r) -> None:
    fanout = geometric_fanout(budget, gamma, alpha, r, vocab_size=10**6)
    for got, want in zip(fanout, real_fanout(budget, gamma, alpha, r), strict=True):
        assert abs(got - want) < 1.0 + 1e-9


def test_geometric_fanout_examples_and_edges() -> None:
    assert geometric_fanout(20, 4, 0.9, 1.0, 151_936) == [3, 3, 3, 3, 8]  # F_gamma > F_0
    assert geometric_fanout(20, 4, 0.0, 1.0, 100) == [20, 0, 0, 0, 0]
    assert geometric_fanout(20, 4, 1.0, 1.0, 100) == [0, 0, 0, 0, 20]
    assert geometric_fanout(20, 4, 1.0, 1.0, 6) == [0, 0, 0, 0, 5]  # P(k < gamma) = 0
    assert geometric_fanout(2, 4, 0.6, 1.0, 100) == [1, 1, 0, 0, 0]  # budget < gamma + 1
    assert geometric_fanout(2, 4, 0.95, 1.0, 100) == [1, 0, 0, 0, 1]
    assert geometric_fanout(0, 4, 0.6, 1.0, 100) == [0] * 5
    assert sum(geometric_fanout(10**6, 3, 0.5, 1.0, 50)) == 4 * 49  # capped at V - 1
    assert geometric_fanout(7, 0, 0.5, 1.0, 100) == [7]


@pytest.mark.parametrize(
    "args",
    [
        (-1, 4, 0.5, 1.0, 100),
        (10, -1, 0.5, 1.0, 100),
        (10, 4, 1.5, 1.0, 100),
        (10, 4, -0.1, 1.0, 100),
        (10, 4, 0.5, 0.0, 100),
        (10, 4, 0.5, math.inf, 100),
        (10, 4, 0.5, 1.0, 1),
        (10.5, 4, 0.5, 1.0, 100),
    ],
)
def test_geometric_fanout_rejects_invalid_arguments(args) -> None:
    with pytest.raises(ValueError):
        geometric_fanout(*args)


def test_uniform_fanout() -> None:
    assert uniform_fanout(20, 4) == [4, 4, 4, 4, 4]
    assert uniform_fanout(22, 4) == [5, 5, 4, 4, 4]
    assert uniform_fanout(3, 4) == [1, 1, 1, 0, 0]
    assert uniform_fanout(100, 1, vocab_size=10) == [9, 9]
    with pytest.raises(ValueError):
        uniform_fanout(-1, 4)


def test_geometric_beats_uniform_on_the_hit_objective() -> None:
    c, r, alpha, gamma, budget = 0.5, 0.8, 0.7, 4, 20

    def objective(fanout: list[int]) -> float:
        return sum(_outcome_prob(alpha, gamma, k) * hit_rate(f, c, r) for k, f in enumerate(fanout))

    geometric = geometric_fanout(budget, gamma, alpha, r, 151_936)
    assert objective(geometric) > objective(uniform_fanout(budget, gamma))


@settings(max_examples=200, deadline=None)
@given(alpha=st.floats(0.0, 1.0), gamma=st.integers(1, 10))
def test_alpha_from_accept_length_inverts_expected_accept_length(alpha, gamma) -> None:
    length = expected_accept_length(alpha, gamma)
    assert 1.0 <= length <= gamma + 1
    assert abs(alpha_from_accept_length(length, gamma) - alpha) < 1e-6


def test_alpha_is_not_the_acceptance_rate() -> None:
    alpha = alpha_from_accept_length(4.1, 4)
    assert abs(alpha - 0.9) < 0.01 and abs((4.1 - 1) / 4 - 0.775) < 1e-12
    assert expected_accept_length(0.5, 2) == 1.75
    for bad in ((0.5, 4), (5.5, 4), (math.nan, 4), (2.0, 0)):
        with pytest.raises(ValueError):
            alpha_from_accept_length(*bad)
    with pytest.raises(ValueError):
        expected_accept_length(1.2, 3)


def test_fit_hit_model_recovers_power_law() -> None:
    fanouts = [1, 2, 4, 8, 16]
    rates = [1 - 0.6 * f**-0.7 for f in fanouts]
    c, r = fit_hit_model(fanouts, rates)
    assert abs(c - 0.6) < 1e-9 and abs(r - 0.7) < 1e-9
    assert hit_rate(0, c, r) == 0.0 and abs(hit_rate(4, c, r) - rates[2]) < 1e-12
    with pytest.raises(ValueError):
        fit_hit_model([3, 3], [0.5, 0.6])


def test_fit_hit_counts_uses_half_a_pseudo_miss_and_enough_outcomes() -> None:
    # F = 1: 3 of 3 hit -> 1 - 0.5/4; F = 2: 1 of 3 -> 1 - 2.5/4; F = 0 and F = 4 (too few) ignored
    got = fit_hit_counts({0: 9, 1: 3, 2: 3, 4: 2}, {1: 3, 2: 1, 4: 2}, min_outcomes=3)
    assert got == pytest.approx(fit_hit_model([1, 2], [1 - 0.5 / 4, 1 - 2.5 / 4]))
    assert fit_hit_counts({1: 3, 4: 2}, {1: 3}, min_outcomes=3) is None  # one usable F

"""Speedup model (Theorem 7, corrected) against a Monte-Carlo simulation of SSD rounds."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_ssd.saguaro import expected_accept_length, expected_speedup


def simulate(alpha_hit, alpha_miss, gamma, p_hit, t_spec, t_backup, batch, rounds, seed=0):
    """Tokens per request per verify time over `rounds` simulated rounds of a batch."""
    rng = np.random.default_rng(seed)
    hit = rng.random((rounds, batch)) < p_hit
    alpha = np.where(hit, alpha_hit, alpha_miss)[..., None]
    accepted = (rng.random((rounds, batch, gamma)) < alpha).cumprod(axis=2).sum(axis=2)
    tokens = (accepted + 1).sum()
    hidden = max(1.0, t_spec)
    # The batch waits for its slowest request: a round with any miss pays the backup.
    time = np.where(hit.all(axis=1), hidden, hidden + t_backup).sum()
    return tokens / (batch * time)


@pytest.mark.parametrize(
    "params",
    [
        # alpha_hit, alpha_miss, gamma, p_hit, t_spec, t_backup, batch
        (0.9, 0.9, 4, 0.8, 0.7, 0.5, 1),
        (0.85, 0.4, 4, 0.7, 1.6, 0.05, 4),
        (0.8, 0.8, 3, 0.9, 1.0, 0.6, 16),
        (0.95, 0.1, 5, 0.6, 0.3, 0.01, 2),
    ],
)
def test_model_matches_simulation(params) -> None:
    model = expected_speedup(*params)
    simulated = simulate(*params, rounds=100_000)
    assert abs(simulated - model) / model < 0.01, (simulated, model)


def test_numerator_is_per_request_and_denominator_uses_p_hit_to_the_b() -> None:
    # b = 2, p_hit = 0.5: the old form (p_b in the numerator too) would give a different value.
    e_hit, e_miss = expected_accept_length(0.9, 4), expected_accept_length(0.5, 4)
    want = (0.5 * e_hit + 0.5 * e_miss) / (0.25 * 1.0 + 0.75 * (0.4 + 1.0))
    assert expected_speedup(0.9, 0.5, 4, 0.5, 0.8, 0.4, batch_size=2) == pytest.approx(want)


def test_limits() -> None:
    # Every request hits and the speculator keeps up: E(alpha) tokens per verify, times T_AR/T_v.
    assert expected_speedup(0.9, 0.2, 4, 1.0, 0.5, 3.0) == pytest.approx(
        expected_accept_length(0.9, 4)
    )
    assert expected_speedup(0.9, 0.2, 4, 1.0, 2.0, 3.0) == pytest.approx(
        expected_accept_length(0.9, 4) / 2.0
    )
    assert expected_speedup(0.9, 0.2, 4, 1.0, 0.5, 3.0, t_ar_over_t_verify=0.4) == pytest.approx(
        0.4 * expected_accept_length(0.9, 4)
    )
    speeds = [expected_speedup(0.9, 0.6, 4, 0.8, 0.9, 0.5, b) for b in (1, 2, 8, 64)]
    assert speeds == sorted(speeds, reverse=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(alpha_hit=1.2),
        dict(p_hit=-0.1),
        dict(t_spec=-1.0),
        dict(t_backup=float("nan")),
        dict(batch_size=0),
        dict(t_ar_over_t_verify=0.0),
        dict(lookahead=-1),
    ],
)
def test_invalid_arguments(kwargs) -> None:
    args = dict(alpha_hit=0.9, alpha_miss=0.5, lookahead=4, p_hit=0.8, t_spec=0.5, t_backup=0.2)
    args.update(kwargs)
    with pytest.raises(ValueError):
        expected_speedup(**args)

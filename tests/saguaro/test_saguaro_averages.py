"""`saguaro.averages`: the moving-average rule every online estimate uses."""

from __future__ import annotations

import pytest

from sglang_ssd.saguaro.averages import Ema, ema


def test_ema_starts_at_the_first_observation_then_weighs_each_new_one() -> None:
    assert ema(None, 3.0, 0.2) == 3.0
    assert ema(3.0, 8.0, 0.2) == pytest.approx(4.0)
    assert ema(3.0, 8.0, 1.0) == 8.0  # weight 1: only the newest counts


@pytest.mark.parametrize("weight", [0.0, -0.1, 1.5])
def test_a_weight_outside_zero_one_is_refused(weight: float) -> None:
    with pytest.raises(ValueError, match="weight"):
        ema(1.0, 2.0, weight)


def test_ema_object_counts_what_it_folded_in() -> None:
    average = Ema(0.5)
    for x in (4.0, 2.0, 0.0):
        average.add(x)
    assert average.value == pytest.approx(1.5) and average.count == 3

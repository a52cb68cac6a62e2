"""eval.options_cost: the per-side summary, and every measured option is one SSD serves."""

from __future__ import annotations

import pytest

from eval import options_cost
from eval.client import RequestResult
from sglang_ssd.integration import request_checks


def test_side_sums_tokens_over_seconds_and_averages_meta() -> None:
    results = [
        RequestResult("a", 0.0, 2.0, completion_tokens=10, meta_info={"spec_accept_length": 2.0}),
        RequestResult("b", 0.0, 3.0, completion_tokens=20, meta_info={"spec_accept_length": 3.0}),
    ]
    side = options_cost._side(results)
    assert (side["tokens"], side["seconds"]) == (30, 5.0)
    assert side["tok_per_s"] == pytest.approx(6.0)
    assert side["accept_length"] == pytest.approx(2.5) and side["cache_hit_rate"] is None


@pytest.mark.parametrize("name", list(options_cost.OPTIONS))
def test_each_measured_option_is_served(name: str) -> None:
    assert request_checks.sampling_refusal(options_cost.OPTIONS[name]) is None


def test_min_new_tokens_stays_below_the_maximum() -> None:
    from eval.options_cost import OPTIONS, params_for

    assert params_for("min_new_tokens", 64) == {"min_new_tokens": 48}
    assert params_for("min_new_tokens", 32) == {"min_new_tokens": 24}
    assert params_for("regex", 32) == OPTIONS["regex"]

"""Pool admission and prefill chunking: which requests fit, how much prefill to feed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sglang_ssd.speculator.admission import admit, prefill_plan


def test_admit_in_order_and_let_smaller_later_requests_fit():
    assert admit([4, 4, 4], 10) == [True, True, False]
    assert admit([8, 5, 2], 9) == [True, False, False]
    assert admit([12, 5, 2], 9) == [False, True, True]
    assert admit([], 0) == []
    assert admit([0, 1], 0) == [True, False]


def test_prefill_plan_first_come_first_served_within_budget_and_pool():
    assert prefill_plan([10, 200, 3], budget=16, free=1000) == [10, 6, 0]
    assert prefill_plan([10, 200, 3], budget=1000, free=12) == [10, 2, 0]
    assert prefill_plan([0, 5], budget=4, free=4) == [0, 4]
    assert prefill_plan([5], budget=4, free=0) == [0]


@given(st.lists(st.integers(0, 50), max_size=8), st.integers(0, 120), st.integers(0, 120))
def test_prefill_plan_bounds(backlogs, budget, free):
    plan = prefill_plan(backlogs, budget, free)
    assert all(0 <= n <= b for n, b in zip(plan, backlogs, strict=True))
    assert sum(plan) == min(sum(backlogs), budget, free)


@given(st.lists(st.integers(0, 50), max_size=8), st.integers(0, 120))
def test_admitted_needs_fit(needs, free):
    admitted = admit(needs, free)
    assert sum(n for n, ok in zip(needs, admitted, strict=True) if ok) <= free

"""eval.distribution without models or servers: the merge rule, the statistic, the power
search, the verdict and resuming a results file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eval.distribution.power import half_law, power_at_tv, size_for_power
from eval.distribution.run import _earlier, verdict
from eval.distribution.statistic import MIN_EXPECTED, chi_square, merge_groups

# A law with a few heavy cells and a long light tail, like the tiny pair's.
LAW = np.array([0.3, 0.2, 0.15, 0.1, 0.05] + [0.2 / 40] * 40)


def test_merge_groups_pools_light_cells_until_each_group_expects_enough() -> None:
    n = 600  # tail cells expect 3: they pair up exactly
    groups, k = merge_groups(LAW, n)
    expected = np.bincount(groups, weights=LAW * n, minlength=k)
    assert expected.min() >= MIN_EXPECTED
    heavy = groups[:5]
    assert len(set(heavy.tolist())) == 5  # cells above the threshold stand alone
    assert not set(heavy.tolist()) & set(groups[5:].tolist())


def test_chi_square_of_expected_counts_is_zero() -> None:
    counts = np.round(LAW * 1000).astype(np.int64)
    result = chi_square([counts], [counts / counts.sum()])
    assert result.statistic == pytest.approx(0.0)
    assert result.p_value == pytest.approx(1.0) and not result.rejects


def test_power_grows_with_size_and_the_search_finds_the_threshold() -> None:
    alternative = [half_law(LAW)]
    assert power_at_tv([LAW], alternative, 512, 0.05) < power_at_tv([LAW], alternative, 8192, 0.05)
    assert power_at_tv([LAW], alternative, 512, 0.9) is None  # beyond the direction's reach
    n = size_for_power([LAW], alternative, tv=0.05, quantum=256, most=1 << 15)
    assert power_at_tv([LAW], alternative, n, 0.05) >= 0.9
    assert power_at_tv([LAW], alternative, n - 256, 0.05) < 0.9


def _results(rejects: dict[str, bool], controls_ok: bool = True) -> dict:
    return {
        "configurations": {k: {"chi_square": {"rejects": v}} for k, v in rejects.items()},
        "negative_controls": {"exact": {"as_expected": controls_ok}},
    }


def test_verdict_needs_every_configuration_and_control() -> None:
    names = ["ar", "ssd", "ssd_jit", "ssd_beta_0.5"]
    assert verdict(_results(dict.fromkeys(names, False))) == "pass"
    assert verdict(_results(dict.fromkeys(names[:3], False))) == "fail"
    assert verdict(_results({**dict.fromkeys(names, False), "ssd": True})) == "fail"
    assert verdict(_results(dict.fromkeys(names, False), controls_ok=False)) == "fail"


def test_resume_keeps_configurations_of_the_same_size(tmp_path: Path) -> None:
    out = tmp_path / "distribution.json"
    assert _earlier(out, 64) == ({}, [])
    first = {"command": ["x"], "date": "d1", "git": {}, "samples_per_prompt": 64}
    out.write_text(json.dumps({**first, "configurations": {"ar": {"chi_square": {}}}}))
    configurations, earlier = _earlier(out, 64)
    assert configurations == {"ar": {"chi_square": {}, "date": "d1"}}
    assert earlier == [{"command": ["x"], "date": "d1", "git": {}}]
    with pytest.raises(ValueError, match="64 samples per prompt"):
        _earlier(out, 128)

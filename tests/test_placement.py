"""CPU placement of target and speculator."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ssd.speculator import affinity


def test_split_gives_the_speculator_the_last_core(monkeypatch):
    monkeypatch.setattr(affinity, "available_cpus", lambda: [0, 1, 2, 3])
    assert affinity.split_cpus(None) == ([0, 1, 2], [3])
    assert affinity.split_cpus([2, 3]) == ([0, 1], [2, 3])


def test_single_core_is_shared(monkeypatch):
    monkeypatch.setattr(affinity, "available_cpus", lambda: [0])
    assert affinity.split_cpus(None) == ([0], [0])


@pytest.mark.parametrize("draft", [[0, 1], [5]])
def test_bad_splits_are_refused(monkeypatch, draft):
    monkeypatch.setattr(affinity, "available_cpus", lambda: [0, 1])
    with pytest.raises(ValueError, match="disjoint"):
        affinity.split_cpus(draft)


def test_pin_process_pins_and_sets_threads():
    before, threads = sorted(os.sched_getaffinity(0)), torch.get_num_threads()
    try:
        assert affinity.pin_process(before[:1]) == before[:1]
        assert sorted(os.sched_getaffinity(0)) == before[:1]
        assert torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
    with pytest.raises(ValueError):
        affinity.pin_process([10_000])

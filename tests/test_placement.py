"""CPU placement of target and speculator."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ssd import placement
from sglang_ssd.config import SSDConfig


def test_split_gives_the_speculator_the_last_core(monkeypatch):
    monkeypatch.setattr(placement, "available_cpus", lambda: [0, 1, 2, 3])
    assert placement.split_cpus(None) == ([0, 1, 2], [3])
    assert placement.split_cpus([2, 3]) == ([0, 1], [2, 3])


def test_single_core_is_shared(monkeypatch):
    monkeypatch.setattr(placement, "available_cpus", lambda: [0])
    assert placement.split_cpus(None) == ([0], [0])


def test_sync_mode_may_give_both_every_core(monkeypatch):
    """SYNC-2c: target and speculator take turns on all cores; SSD's async mode may not."""
    monkeypatch.setattr(placement, "available_cpus", lambda: [0, 1])
    assert placement.split_cpus([0, 1], take_turns=True) == ([0, 1], [0, 1])
    assert placement.split_cpus([1], take_turns=True) == ([0], [1])
    with pytest.raises(ValueError, match="only --ssd-mode sync"):
        placement.split_cpus([0, 1])
    monkeypatch.setattr(placement, "pin_process", lambda cpus: list(cpus))
    shared = placement.place(SSDConfig(mode="sync", draft_cpus=(0, 1)), "cpu")
    assert shared == placement.Placement("cpu", (0, 1), (0, 1))


@pytest.mark.parametrize("draft", [[0, 1], [5]])
def test_bad_splits_are_refused(monkeypatch, draft):
    monkeypatch.setattr(placement, "available_cpus", lambda: [0, 1])
    with pytest.raises(ValueError, match="disjoint"):
        placement.split_cpus(draft)


def test_pin_process_pins_and_sets_threads():
    before, threads = sorted(os.sched_getaffinity(0)), torch.get_num_threads()
    try:
        assert placement.pin_process(before[:1]) == before[:1]
        assert sorted(os.sched_getaffinity(0)) == before[:1]
        assert torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
    with pytest.raises(ValueError):
        placement.pin_process([10_000])


def test_place_on_cpu_pins_the_target_and_gives_the_speculator_its_cores(monkeypatch):
    pinned: list[list[int]] = []
    monkeypatch.setattr(placement, "available_cpus", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(placement, "pin_process", lambda cpus: pinned.append(list(cpus)))
    assert placement.place(SSDConfig(), "cpu") == placement.Placement("cpu", (3,), (0, 1, 2))
    assert pinned == [[0, 1, 2]]
    assert placement.place(SSDConfig(draft_cpus=(2, 3)), "cpu").cpus == (2, 3)


def test_place_on_cuda_takes_the_next_gpu_or_shares_the_last(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert placement.place(SSDConfig(), "cuda:0") == placement.Placement("cuda:1", None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert placement.place(SSDConfig(), "cuda:0").device == "cuda:0"
    assert placement.place(SSDConfig(draft_device="cuda:3"), "cuda:0").device == "cuda:3"

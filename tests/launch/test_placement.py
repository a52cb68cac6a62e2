"""CPU placement of target and speculator."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.launch import placement


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


def _cuda(monkeypatch, count: int, current: int = 0) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_place_on_cuda_takes_the_next_gpu(monkeypatch):
    _cuda(monkeypatch, 2)
    assert placement.place(SSDConfig(), "cuda:0") == placement.Placement("cuda:1", None)
    assert placement.place(SSDConfig(), "cuda").device == "cuda:1"  # SGLang's "cuda": current
    _cuda(monkeypatch, 4)
    assert placement.place(SSDConfig(draft_device="cuda:3"), "cuda:0").device == "cuda:3"
    assert placement.place(SSDConfig(draft_device="cpu"), "cuda:0") == placement.Placement(
        "cpu", None
    )


def test_one_gpu_is_refused_naming_the_flag(monkeypatch):
    """NCCL refuses two ranks on one GPU: the speculator never shares the target's."""
    _cuda(monkeypatch, 1)
    with pytest.raises(ValueError, match="--ssd-draft-device"):
        placement.place(SSDConfig(), "cuda:0")
    with pytest.raises(ValueError, match="one of the target's GPUs"):
        placement.place(SSDConfig(draft_device="cuda:0"), "cuda:0")


def test_target_gpus_follow_sglangs_assignment():
    """SGLang 0.5.23 (data_parallel_controller.py): replica r starts at r·tp·pp·step, rank
    (pp, tp) at + pp·tp + tp·step."""
    gpus = placement.TargetGpus(base_gpu_id=2, tp_size=2, pp_size=1, dp_size=2)
    assert gpus.replica(0) == (2, 3) and gpus.replica(1) == (4, 5)
    assert gpus.all() == (2, 3, 4, 5)
    assert gpus.dp_rank_of(5) == 1
    stepped = placement.TargetGpus(tp_size=2, gpu_id_step=2)
    assert stepped.all() == (0, 2)
    with pytest.raises(ValueError, match="no target rank"):
        stepped.dp_rank_of(1)
    args = SimpleNamespace(base_gpu_id=1, tp_size=4, pp_size=None, dp_size=1, gpu_id_step=1)
    assert placement.TargetGpus.of(args) == placement.TargetGpus(1, 4, 1, 1, 1)


def test_default_draft_gpu_comes_after_every_target_rank(monkeypatch):
    """With TP the next GPU is a TP peer; with DP, base + tp_size is the next replica's."""
    tp = placement.TargetGpus(tp_size=2)
    assert placement.draft_gpu(SSDConfig(), tp, 0, 8) == "cuda:2"
    dp = placement.TargetGpus(base_gpu_id=1, tp_size=2, dp_size=2)
    assert [placement.draft_gpu(SSDConfig(), dp, r, 8) for r in (0, 1)] == ["cuda:5", "cuda:6"]
    _cuda(monkeypatch, 8, current=1)
    assert placement.place(SSDConfig(), "cuda:1", tp).device == "cuda:2"
    assert placement.place(SSDConfig(), "cuda:3", dp).device == "cuda:6"  # replica 1's rank


def test_each_replica_passes_its_own_dp_rank(monkeypatch):
    """The worker names its replica (SGLang's dp_rank); a rank whose replica does not run on
    the target's GPU is refused."""
    _cuda(monkeypatch, 8)
    dp = placement.TargetGpus(tp_size=2, dp_size=2)
    spots = [placement.place(SSDConfig(), f"cuda:{2 * r}", dp, r) for r in (0, 1)]
    assert [(p.device, p.dp_rank) for p in spots] == [("cuda:4", 0), ("cuda:5", 1)]
    with pytest.raises(ValueError, match="DP replica 0 runs on GPUs"):
        placement.place(SSDConfig(), "cuda:2", dp, 0)


@pytest.mark.parametrize(
    ("draft_device", "gpus", "count", "message"),
    [
        ("cuda:1", placement.TargetGpus(tp_size=2), 4, "one of the target's GPUs"),
        (None, placement.TargetGpus(tp_size=2), 2, "cuda:2 does not exist"),
        ("cuda:7", placement.TargetGpus(), 4, "cuda:7 does not exist"),
        ("cuda:3", placement.TargetGpus(dp_size=2), 4, "all 2 DP replicas on one GPU"),
    ],
)
def test_collisions_are_refused(draft_device, gpus, count, message):
    with pytest.raises(ValueError, match=message):
        placement.draft_gpu(SSDConfig(draft_device=draft_device), gpus, 0, count)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_widened_pins_wider_within_the_block_and_back_after_also_on_errors():
    before, threads = sorted(os.sched_getaffinity(0)), torch.get_num_threads()
    own, extra = before[-1:], before[:1]
    try:
        os.sched_setaffinity(0, own)
        with pytest.raises(RuntimeError), placement.widened(own, extra):
            assert sorted(os.sched_getaffinity(0)) == sorted(own + extra)
            assert torch.get_num_threads() == 2
            raise RuntimeError("the block fails")
        assert sorted(os.sched_getaffinity(0)) == own and torch.get_num_threads() == 1
        with placement.widened(own, own):  # nothing to add: nothing changes
            assert sorted(os.sched_getaffinity(0)) == own and torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)

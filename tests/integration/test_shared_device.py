"""tests/gpu/test_gpu_shared_device.py's whole-process test on the CPU: the speculator as its
own process (`python -m sglang_ssd.speculator`, started by `SpeculatorClient`), the target in
this process, greedy rounds equal to the target's own greedy continuation; the link is gloo,
as it is for the shared-GPU test (on the CPU the host staging has nothing to copy)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from shared_device_round import first_divergence_from_ar, greedy_rounds, shared_device
from ssd_round import VOCAB, make_pair

FP32_MARGIN = 1e-4  # fp32 top-2 margins below this may flip between forward shapes


def test_speculator_process_beside_the_target_greedy_equals_ar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft, target = make_pair(tmp_path)
    device = torch.device("cpu")
    with shared_device(monkeypatch, device):
        emitted, sources, model = greedy_rounds(draft, target, device, VOCAB)
    first_divergence_from_ar(model, emitted, FP32_MARGIN)
    assert any(s in ("cache", "jit") for round_ in sources for s in round_), sources
    assert all(len(tokens) > 6 for tokens in emitted.values()), emitted

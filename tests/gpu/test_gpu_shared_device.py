"""One GPU, two processes: the speculator as its own process on the target's GPU, the target in
this process, greedy rounds equal to the target's own greedy continuation (`shared_device_round`:
what it sets aside for tests, a speculator on the target's GPU and a gloo link staged through
host memory). Runs the bf16, head-dim-64 pair (FlashInfer's shapes) and needs msgspec, pyzmq and
psutil (skipped without them). tests/integration/test_shared_device.py runs the same on the CPU.

Covered: the speculator process starting on CUDA (its startup, its first forwards and
pre-speculation), the control socket, the tensor link's transfers of tokens and q from a CUDA
speculator, q laid out on the target's GPU, the verify on CUDA, cache hits. Not covered: NCCL
(two ranks cannot share a GPU), SGLang's scheduler and TARGET_VERIFY forward (the target is an
HF model here), and two processes contending for one GPU's memory and time as they would not
on two GPUs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from shared_device_round import first_divergence_from_ar, greedy_rounds, shared_device
from ssd_round import VOCAB, make_pair

pytestmark = pytest.mark.gpu

BF16_MARGIN = 0.25  # bf16 top-2 margins below this may flip between forward shapes


def test_speculator_process_on_the_targets_gpu_greedy_equals_ar(
    cuda: torch.device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record_property
) -> None:
    for module in ("msgspec", "zmq", "psutil"):
        pytest.importorskip(module)
    draft, target = make_pair(tmp_path, dtype=torch.bfloat16, head_dim=64)
    device = torch.device("cuda", torch.cuda.current_device())
    with shared_device(monkeypatch, device):
        emitted, sources, model = greedy_rounds(draft, target, device, VOCAB)
    ties = first_divergence_from_ar(model, emitted, BF16_MARGIN)
    remote = sum(s in ("cache", "jit") for round_ in sources for s in round_)
    record_property("detail", f"tokens {emitted}, sources {sources}, near-ties {ties}")
    assert remote > 0, f"no round drafted by the speculator process: {sources}"

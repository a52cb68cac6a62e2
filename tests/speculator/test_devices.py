"""Device consistency of the speculator's state, checked without a GPU.

The KV pool hands out slots on its own device, so a request's empty slot list must start there
too (else the first feed's `torch.cat` mixes devices: on CUDA every open failed). A "meta" pool
stands in for a CUDA one: `torch.cat` refuses to mix cpu and meta tensors just as it refuses cpu
and cuda. Draft generators must live on a CUDA device's own index (`torch.multinomial` on CUDA
probabilities refuses a CPU generator).
"""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.speculator import engine as engine_module
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.speculator.kv_pool import KVPool
from sglang_ssd.speculator.packing import causal_segment
from sglang_ssd.speculator.state import empty_slots, generator_device
from sglang_ssd.testing.tiny_models import TinySpec, make_tiny_model

PROMPT = [40, 71, 72, 73, 0, 5]


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), TinySpec(num_layers=1))


def _engine_with_pool_on(path, device: str) -> SpeculatorEngine:
    cpu = DraftModel.load(path, dtype=torch.float32, num_slots=64)
    pool = cpu.kv_pool
    moved = KVPool(pool.num_layers, 64, pool.num_kv_heads, pool.head_dim, torch.float32, device)
    return SpeculatorEngine(DraftModel(cpu.hf, moved), SSDConfig(lookahead=4), seed=0)


def test_empty_slots_live_on_the_pools_device(tiny_model_path) -> None:
    engine = _engine_with_pool_on(tiny_model_path, "meta")
    engine.open("r", PROMPT, temperature=0.0, top_k=1, top_p=1.0, prefill=False)
    state = engine.requests["r"]
    assert state.slots.device == engine.model.kv_pool.device == torch.device("meta")
    assert state.slots.dtype == torch.int64 and state.num_fed == 0
    # The first feed's segment: the request's (empty) slots with the pool's new ones.
    new = engine.model.kv_pool.alloc(3)
    segment = causal_segment(state.slots, torch.tensor(PROMPT[:3]), 0, new)
    assert segment.kv_slots.device == torch.device("meta") and segment.kv_slots.numel() == 3


def test_empty_slots_helper() -> None:
    assert empty_slots("meta").device == torch.device("meta")
    assert empty_slots("cpu").shape == (0,) and empty_slots("cpu").dtype == torch.int64


def test_generator_device_follows_cuda_and_falls_back_to_the_cpu(monkeypatch) -> None:
    assert generator_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert generator_device("cuda:3") == torch.device("cuda", 3)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert generator_device("cuda") == torch.device("cuda", 2)
    assert generator_device("cpu") == torch.device("cpu")
    assert generator_device("meta") == torch.device("cpu")  # meta has no generators


def test_request_generators_are_made_for_the_models_device(tiny_model_path, monkeypatch) -> None:
    """The engine asks `generator_device` for the model's device (on CUDA: that GPU); the random
    backup's generator stays on the CPU (its proposals become Python lists at once)."""
    asked: list[torch.device] = []

    def recording(device: torch.device | str) -> torch.device:
        asked.append(torch.device(device))
        return generator_device(device)

    monkeypatch.setattr(engine_module, "generator_device", recording)
    engine = _engine_with_pool_on(tiny_model_path, "cpu")
    assert engine.random.generator.device == torch.device("cpu")
    engine.open("r", PROMPT, temperature=0.7, top_k=-1, top_p=1.0, prefill=False)
    assert asked == [engine.model.device]
    assert engine.requests["r"].generator.device == generator_device(engine.model.device)

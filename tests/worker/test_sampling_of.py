"""`ssd_worker._sampling_of` reads p's parameters on the host, from the requests, and gets what
SGLang's own `SamplingBatchInfo.from_schedule_batch` puts on the device (run here on the CPU),
so the verify needs no device-to-host copy of them."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


class _Batch:
    """The parts of SGLang's `ScheduleBatch` that `from_schedule_batch` reads (weak-referable,
    as its penalizer orchestrator needs)."""

    def __init__(self, reqs: list) -> None:
        self.reqs, self.device = reqs, "cpu"
        self.has_grammar, self.return_logprob = False, False


class _Req:
    def __init__(self, rid: str, sampling_params) -> None:
        self.rid, self.sampling_params = rid, sampling_params
        self.custom_logit_processor, self.grammar = None, None
        self.return_sampling_mask, self.sampling_logprobs_mode = False, None


@pytest.fixture
def sglang_context() -> Iterator[None]:
    """SGLang's runtime context for a CPU server (what `from_schedule_batch` reads)."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(ServerArgs(model_path="dummy", device="cpu"), role="test", ranks=SpawnRanks(0))
    yield
    reset_context()


@pytest.mark.parametrize("with_min_p", [True, False], ids=["min-p", "no-min-p"])
def test_host_parameters_equal_sglangs_device_ones(sglang_context, with_min_p: bool) -> None:
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.sampling.sampling_params import SamplingParams

    from sglang_ssd.worker.ssd_worker import _sampling_of

    options = [
        {"temperature": 0.0},  # greedy: SGLang stores top_k = 1
        {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05 if with_min_p else 0.0},
        {"temperature": 1.3, "top_p": 0.3},
        {"temperature": 1.0},  # top_k -1: SGLang's whole-vocabulary value
    ]
    reqs = []
    for i, kw in enumerate(options):
        params = SamplingParams(**kw)
        params.normalize(None)
        reqs.append(_Req(f"r{i}", params))
    batch = _Batch(reqs)
    batch.sampling_info = info = SamplingBatchInfo.from_schedule_batch(batch, vocab_size=128)
    ours = _sampling_of(batch, "pytorch")
    for name, theirs in (("temperature", info.temperatures), ("top_k", info.top_ks),
                         ("top_p", info.top_ps)):  # fmt: skip
        mine = getattr(ours, name)
        assert mine.device.type == "cpu" and mine.dtype == theirs.dtype, name
        assert torch.equal(mine, theirs.reshape(-1)), name
    assert info.need_min_p_sampling is with_min_p
    if with_min_p:
        assert torch.equal(ours.min_p, info.min_ps)
    else:
        assert ours.min_p is None

"""SSD's server-argument handling on a GPU, checked on the CPU: decode CUDA graphs are turned off (a
captured TARGET_VERIFY has SSD's width and mask fixed at capture), a speculator GPU that collides
with the target's is refused at startup, and so are plain rounds (a width-1 verify under metadata
for γ + 1 positions), at startup and live."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, with_phase

from sglang_ssd.config import ENV_VAR, SSDConfig
from sglang_ssd.integration.registration import (
    check_gpu_placement,
    disable_verify_cuda_graphs,
    handle_ssd_server_args,
    refuse_plain_rounds_off_cpu,
)
from sglang_ssd.worker.round_mode import mode_refusal


def _args(device: str, **extra) -> SimpleNamespace:
    graphs = with_phase(CudaGraphConfig(), "decode", backend=Backend.FULL)
    graphs = with_phase(graphs, "prefill", backend=Backend.BREAKABLE)
    fields = dict(
        device=device,
        cuda_graph_config=graphs,
        max_running_requests=None,
        speculative_num_steps=4,
    )
    return SimpleNamespace(**{**fields, **extra})


def test_ssd_on_cuda_runs_its_verify_without_decode_cuda_graphs() -> None:
    args = _args("cuda")
    handle_ssd_server_args(args)
    assert args.cuda_graph_config.decode.backend == Backend.DISABLED
    assert args.cuda_graph_config.prefill.backend == Backend.BREAKABLE  # prefill keeps its own
    assert args.disable_overlap_schedule is True


def test_cpu_and_already_disabled_configs_are_left_alone() -> None:
    args = _args("cpu")
    before = args.cuda_graph_config
    disable_verify_cuda_graphs(args)
    assert args.cuda_graph_config is before
    disabled = with_phase(CudaGraphConfig(), "decode", backend=Backend.DISABLED)
    off = _args("cuda", cuda_graph_config=disabled)
    kept = off.cuda_graph_config
    disable_verify_cuda_graphs(off)
    assert off.cuda_graph_config is kept


def test_gpu_collisions_are_refused_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    tp2 = dict(tp_size=2, pp_size=1, dp_size=1, base_gpu_id=0, gpu_id_step=1)
    check_gpu_placement(_args("cuda", **tp2), device_count=3)  # speculator on cuda:2
    with pytest.raises(ValueError, match="--ssd-draft-device"):
        check_gpu_placement(_args("cuda", **tp2), device_count=2)
    monkeypatch.setenv(ENV_VAR, SSDConfig(draft_device="cuda:1").to_json())
    with pytest.raises(ValueError, match="one of the target's GPUs"):
        check_gpu_placement(_args("cuda", **tp2), device_count=4)
    monkeypatch.setenv(ENV_VAR, SSDConfig(draft_device="cpu").to_json())
    check_gpu_placement(_args("cuda", **tp2), device_count=2)  # on CPU cores: nothing to check
    check_gpu_placement(_args("cpu", **tp2), device_count=0)


def test_plain_rounds_are_refused_off_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--ssd-mode plain` is CPU-only; auto (the default) and sync serve on a GPU, where auto
    offers async alone (`round_mode.offered`)."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    refuse_plain_rounds_off_cpu(_args("cuda"))  # the default, auto: served
    for setting in ("auto", "async", "sync"):
        monkeypatch.setenv(ENV_VAR, SSDConfig(mode=setting).to_json())
        refuse_plain_rounds_off_cpu(_args("cuda"))
    monkeypatch.setenv(ENV_VAR, SSDConfig(mode="plain").to_json())
    refuse_plain_rounds_off_cpu(_args("cpu"))
    with pytest.raises(ValueError, match="--ssd-mode plain is not supported"):
        refuse_plain_rounds_off_cpu(_args("cuda"))
    assert mode_refusal("auto", "cuda:1") is None and mode_refusal("plain", "cpu") is None
    assert "γ + 1 positions" in (mode_refusal("plain", "cuda:1") or "")

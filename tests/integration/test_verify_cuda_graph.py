"""`--ssd-verify-cuda-graph`: decode CUDA graphs kept for SSD's verify where SGLang captures
TARGET_VERIFY at a fixed width, refused where it cannot replay it (the CPU, an EAGLE-3 head
draft, another attention backend). CUDA graphs cannot run here: the SGLang lines that say which
backends capture TARGET_VERIFY (`integration/verify_graphs.py` cites them) are checked to still
say so, so an SGLang upgrade that moves them fails this test instead of leaving stale cites."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import sglang
from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, with_phase

from sglang_ssd.config import ENV_VAR, SSDConfig, SSDConfigError
from sglang_ssd.integration.registration import handle_ssd_server_args, refuse_verify_cuda_graph

SRT = Path(sglang.__file__).parent / "srt"


def _args(device: str, **extra) -> SimpleNamespace:
    graphs = with_phase(CudaGraphConfig(), "decode", backend=Backend.FULL)
    fields = dict(
        device=device,
        cuda_graph_config=graphs,
        max_running_requests=None,
        speculative_num_steps=4,
        speculative_draft_model_path=None,
    )
    return SimpleNamespace(**{**fields, **extra})


def test_the_flag_keeps_decode_graphs_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    off = _args("cuda")
    handle_ssd_server_args(off)
    assert off.cuda_graph_config.decode.backend == Backend.DISABLED  # the default
    monkeypatch.setenv(ENV_VAR, SSDConfig(verify_cuda_graph=True).to_json())
    on = _args("cuda")
    handle_ssd_server_args(on)
    assert on.cuda_graph_config.decode.backend == Backend.FULL
    assert on.speculative_num_draft_tokens == 5  # the fixed width graphs capture: γ + 1


def test_the_flag_parses_as_a_switch() -> None:
    assert SSDConfig().verify_cuda_graph is False
    assert SSDConfig.from_json(SSDConfig(verify_cuda_graph=True).to_json()).verify_cuda_graph
    with pytest.raises(SSDConfigError, match="--ssd-verify-cuda-graph must be a boolean"):
        SSDConfig(verify_cuda_graph="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("device", "extra", "refusal"),
    [
        ("cpu", {}, "needs a CUDA target"),
        ("cuda", {"attention_backend": "torch_native"}, "--attention-backend is torch_native"),
        ("cuda", {"decode_attention_backend": "flex"}, "--decode-attention-backend is flex"),
        ("cuda", {}, None),
        ("cuda", {"attention_backend": "fa3"}, None),
        ("cuda", {"prefill_attention_backend": "flashinfer"}, None),
        ("cuda", {"attention_backend": "triton"}, None),
        ("cuda", {"attention_backend": "trtllm_mha"}, None),
    ],
)
def test_refused_where_sglang_cannot_replay_the_verify(
    monkeypatch: pytest.MonkeyPatch, device: str, extra: dict, refusal: str | None
) -> None:
    monkeypatch.setenv(ENV_VAR, SSDConfig(verify_cuda_graph=True).to_json())
    args = _args(device, **extra)
    if refusal is None:
        refuse_verify_cuda_graph(args)
    else:
        with pytest.raises(ValueError, match=refusal):
            refuse_verify_cuda_graph(args)
    monkeypatch.setenv(ENV_VAR, SSDConfig().to_json())
    refuse_verify_cuda_graph(args)  # without the flag nothing is refused


def test_an_eagle3_head_draft_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SSDConfig(verify_cuda_graph=True, draft_runtime="eagle3-head")
    monkeypatch.setenv(ENV_VAR, config.to_json())
    with pytest.raises(ValueError, match="EAGLE-3 head"):
        refuse_verify_cuda_graph(_args("cuda"))


# (file under sglang/srt, first line, last line, what those lines must contain)
CITED = [
    ("model_executor/runner/decode_cuda_graph_runner.py", 355, 367,
     ["captured_req_width", "ForwardMode.TARGET_VERIFY"]),
    ("model_executor/runner/decode_cuda_graph_runner.py", 911, 917,
     ["is_ngram_supported", "self.captured_req_width", "input_ids.numel()"]),
    ("model_executor/runner/decode_cuda_graph_runner.py", 2134, 2146,
     ["is_ngram()", "self.buffers.custom_mask", "CaptureHiddenMode.NULL"]),
    ("layers/attention/flashinfer_backend.py", 740, 793,
     ["in_capture", "is_target_verify()", "prefill_cuda_graph_metadata[bs]"]),
    ("layers/attention/triton_backend.py", 1321, 1330, ["is_target_verify()"]),
    ("layers/attention/triton_backend.py", 1424, 1428, ["is_target_verify()"]),
    ("layers/attention/flashattention_backend.py", 2823, 2830,
     ["is_target_verify()", "self.topk <= 1", "speculative_num_draft_tokens"]),
    ("layers/attention/flashattention_backend.py", 3170, 3170, ["is_target_verify()"]),
    ("layers/attention/trtllm_mha_backend.py", 866, 866, ["is_target_verify()"]),
    ("layers/attention/trtllm_mha_backend.py", 983, 983, ["is_target_verify()"]),
]  # fmt: skip


@pytest.mark.parametrize(("path", "first", "last", "needles"), CITED)
def test_the_cited_sglang_lines_say_what_we_cite(
    path: str, first: int, last: int, needles: list[str]
) -> None:
    lines = (SRT / path).read_text().splitlines()[first - 1 : last]
    text = "\n".join(lines)
    for needle in needles:
        assert needle in text, f"{path}:{first}-{last} no longer has {needle!r}"

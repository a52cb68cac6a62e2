"""`--ssd-verify-cuda-graph`: when SGLang's decode CUDA graphs may replay SSD's verify.

SGLang 0.5.23 captures speculative decoding's TARGET_VERIFY at one static width per request,
`speculative_num_draft_tokens` (`model_executor/runner/decode_cuda_graph_runner.py:355-367`);
for an `is_ngram()` algorithm, SSD's view, it replays a batch only when it holds exactly that
many rows per request (`:911-917`), and captures with an `NgramVerifyInput` whose custom mask
lives in a buffer refilled at each replay and whose `capture_hidden_mode` is NULL (`:2134-2146`).
SSD verifies γ + 1 positions per request on CUDA every round (plain rounds are refused off the
CPU), so the width is fixed. These attention backends capture and replay TARGET_VERIFY
(`sglang/srt/layers/attention/`):

- flashinfer: `flashinfer_backend.py:740-793` (`init_forward_metadata_out_graph`, the prefill
  wrappers of `prefill_cuda_graph_metadata[bs]` planned with the verify's mask);
- triton: `triton_backend.py:1321-1330` (capture), `:1424-1428` (replay);
- fa3 / fa4 (one class): `flashattention_backend.py:2823-2830` (capture, topk 1:
  `max_seq_len_q` = `speculative_num_draft_tokens`), `:3170` (replay);
- trtllm_mha: `trtllm_mha_backend.py:866` (capture), `:983` (replay).

Refused: the CPU (no CUDA graphs), an EAGLE-3 head draft (NULL capture returns no hidden
states, and the head needs every verify's features), and any other attention backend.
"""

from __future__ import annotations

from typing import Any

VERIFY_GRAPH_BACKENDS = ("flashinfer", "triton", "fa3", "fa4", "trtllm_mha")
BACKEND_FLAGS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
FLAG = "--ssd-verify-cuda-graph"


def verify_cuda_graph_refusal(server_args: Any, cpu: bool, head_draft: bool) -> str | None:
    """Why `--ssd-verify-cuda-graph` cannot be used with these server args, or None.

    Args:
        server_args: SGLang's server args (reads `--attention-backend`,
            `--prefill-attention-backend`, `--decode-attention-backend`; unset ones are SGLang's
            pick for the GPU, one of `VERIFY_GRAPH_BACKENDS`).
        cpu: the target runs on the CPU.
        head_draft: the draft is an EAGLE-3 head (it reads the verify's hidden states).
    """
    if cpu:
        return f"{FLAG} needs a CUDA target: the CPU captures no CUDA graphs"
    if head_draft:
        return (
            f"{FLAG} cannot serve an EAGLE-3 head draft: SGLang captures SSD's verify with "
            "capture_hidden_mode NULL, so a replay returns no target features for the head"
        )
    for name in BACKEND_FLAGS:
        backend = getattr(server_args, name, None)
        if backend is not None and backend not in VERIFY_GRAPH_BACKENDS:
            return (
                f"{FLAG} needs an attention backend that captures TARGET_VERIFY "
                f"({', '.join(VERIFY_GRAPH_BACKENDS)}); --{name.replace('_', '-')} is {backend}"
            )
    return None

"""A Qwen2-shaped target in plain torch, with a static KV cache, for timing its verify on a GPU.

`eval.gpu_model` times the target's verify of n = γ + 1 tokens per request (and the AR step,
n = 1) for a model of the real shapes with random weights: a Qwen2.5-32B-shaped target does not
fit this project's CPU and no weights can be downloaded on the GPU machine, while time depends
only on the shapes. gpt-fast style: each layer is RMSNorm, fused QKV projection (with bias), RoPE,
the n new K/V written into a static cache at their positions, SDPA (GQA) over the cache with a
mask, output projection, RMSNorm, SwiGLU MLP; then the final norm and the LM head on all n rows
(verify needs the logits of every position).

On CUDA one forward of a given (batch, n) is captured as a `torch.cuda.CUDAGraph` (after three
eager warm-ups on a side stream) and its replay is timed with CUDA events; elsewhere (the CPU
dry run) the eager forward is timed with `time.perf_counter`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (Qwen2 family). Sizes in elements; `vocab` is the LM head's rows."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        """Parameter count (embeddings, and the LM head unless tied, included)."""
        d, qkv = self.head_dim, (self.heads + 2 * self.kv_heads) * self.head_dim
        layer = self.hidden * qkv + qkv + self.heads * d * self.hidden
        layer += 3 * self.hidden * self.intermediate + 2 * self.hidden
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.layers * layer + self.vocab * self.hidden + head + self.hidden


# Qwen2.5-32B-Instruct and Qwen2.5-0.5B-Instruct (their config.json files).
QWEN25_32B = Shape(64, 5120, 40, 8, 27648, 152064)
QWEN25_05B = Shape(24, 896, 14, 2, 4864, 151936, tie_embeddings=True)
TINY_TARGET = Shape(2, 64, 4, 2, 128, 256)  # the CPU dry run


class StaticTarget:
    """Random weights of `shape` on `device` (std 0.02) and a static KV cache.

    Args:
        shape: the decoder's shape.
        max_batch: requests the cache holds. max_len: positions per request.
        device, dtype: where and in what the weights and cache live.
    """

    def __init__(
        self,
        shape: Shape,
        max_batch: int,
        max_len: int,
        device: torch.device,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.shape, self.device, self.dtype = shape, device, dtype
        gen = torch.Generator(device=device).manual_seed(0)

        def rand(*size: int) -> torch.Tensor:
            return torch.randn(*size, generator=gen, device=device, dtype=dtype).mul_(0.02)

        s, d = shape, shape.head_dim
        qkv = (s.heads + 2 * s.kv_heads) * d
        self.embed = rand(s.vocab, s.hidden)
        self.lm_head = self.embed if s.tie_embeddings else rand(s.vocab, s.hidden)
        self.layers = [
            {
                "wqkv": rand(qkv, s.hidden),
                "bqkv": rand(qkv),
                "wo": rand(s.hidden, s.heads * d),
                "w_gate_up": rand(2 * s.intermediate, s.hidden),
                "w_down": rand(s.hidden, s.intermediate),
            }
            for _ in range(s.layers)
        ]
        self.k_cache = torch.zeros(
            s.layers, max_batch, s.kv_heads, max_len, d, device=device, dtype=dtype
        )
        self.v_cache = torch.zeros_like(self.k_cache)
        inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        angles = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Logits of n new tokens per request at positions start .. start + n - 1.

        Args:
            tokens: int64 [b, n], b <= max_batch.
            start: int64 [1], the first new position (the same for every request: the context
                each has is `start` tokens, already in the cache).

        Returns:
            [b, n, V] logits in the model dtype.
        """
        s, (b, n) = self.shape, tokens.shape
        pos = start + torch.arange(n, device=tokens.device)  # [n]
        cos, sin = self.cos[pos], self.sin[pos]  # [n, d/2]
        visible = torch.arange(self.k_cache.shape[3], device=tokens.device) <= pos.unsqueeze(1)
        x = F.embedding(tokens, self.embed)
        for i, w in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden,))
            qkv = F.linear(h, w["wqkv"], w["bqkv"]).view(b, n, -1, s.head_dim).transpose(1, 2)
            q, k, v = qkv.split([s.heads, s.kv_heads, s.kv_heads], dim=1)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            self.k_cache[i, :b].index_copy_(2, pos, k)
            self.v_cache[i, :b].index_copy_(2, pos, v)
            attn = F.scaled_dot_product_attention(
                q, self.k_cache[i, :b], self.v_cache[i, :b], attn_mask=visible, enable_gqa=True
            )
            x = x + F.linear(attn.transpose(1, 2).reshape(b, n, -1), w["wo"])
            gate, up = F.linear(F.rms_norm(x, (s.hidden,)), w["w_gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["w_down"])
        return F.linear(F.rms_norm(x, (s.hidden,)), self.lm_head)

    def time_forward(self, batch: int, tokens: int, context: int, reps: int = 10) -> float:
        """Median seconds of one forward of `tokens` new tokens for `batch` requests whose
        context is `context` cached positions: a CUDA-graph replay on CUDA, eager elsewhere."""
        ids = torch.randint(0, self.shape.vocab, (batch, tokens), device=self.device)
        start = torch.tensor([context], device=self.device)
        if self.device.type != "cuda":
            self.forward(ids, start)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                self.forward(ids, start)
                times.append(time.perf_counter() - t0)
            return statistics.median(times)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.forward(ids, start)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.forward(ids, start)
        graph.replay()
        times = []
        for _ in range(reps):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1000.0)
        del graph
        return statistics.median(times)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form, as HF Qwen2) of x [b, h, n, d] at [n, d/2] angles."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

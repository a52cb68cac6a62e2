"""The EAGLE-3 head's math, as SGLang 0.5.23's `LlamaForCausalLMEagle3` computes it.

Source: SGLang's `python/sglang/srt/models/llama_eagle3.py`; EAGLE-3 (Li et al. 2025). One step
over tokens x_t with inputs h_t (and positions p_t):

    g_t   = fc(norms(h_t))                if h_t are target features [n × target_hidden]
          = h_t                           if h_t is the head's own hidden (later draft steps)
    a_t   = g_t + attn(cat(input_layernorm(embed(x_t)), hidden_norm(g_t)))   (qkv input 2H)
    o_t   = a_t + mlp(post_attention_layernorm(a_t))
    logits_t = lm_head(norm(o_t))          [draft vocab]; draft id i is target id d2t[i] + i
    hidden fed back = o_t (or norm(o_t) with `norm_output`)

The embeddings (and with `draft_vocab_size` null, the LM head) are the target's, attached with
`attach_target`; a head file's own `embed_tokens` is used only when target_hidden_size differs
from hidden_size (SGLang's `set_embed` then keeps it). `forward`'s attention is
SDPA over the keys of `past` then this call's keys (`CachedAttention`), so one `forward` serves a
training pass over whole sequences (causal mask), a prefill, and a decode step against a KV
cache; `step` takes any `Attend`, so the speculator runs the same layer over its paged KV pool
(`speculator.head_model`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from sglang_ssd.eagle3.config import Eagle3Config

# q [B, heads, T, d], k and v [B, kv_heads, T, d] (RoPE applied) -> [B, heads, T, d].
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class KVCache:
    """Rotated keys and values of earlier tokens: float [B, kv_heads, S, head_dim] each."""

    key: torch.Tensor
    value: torch.Tensor

    @property
    def length(self) -> int:
        """S, the number of cached positions."""
        return self.key.shape[2]

    def extend(self, other: KVCache) -> KVCache:
        """This cache followed by `other`'s positions (same batch)."""
        return KVCache(torch.cat([self.key, other.key], 2), torch.cat([self.value, other.value], 2))


@dataclass(frozen=True)
class HeadOutput:
    """What one head forward returns.

    Attributes:
        logits: [B, T, lm_head_rows] over the draft vocabulary (map with `target_token_ids`).
        hidden: [B, T, H], the hidden the next draft step feeds back as its `hidden`.
        kv: this call's keys and values only, [B, kv_heads, T, head_dim]; `past.extend(kv)`
            is the cache for the next call.
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    kv: KVCache


def causal_mask(length: int, past: int = 0, device: torch.device | None = None) -> torch.Tensor:
    """bool [length, past + length]: every past key visible, causal among the new tokens."""
    return torch.ones(length, past + length, dtype=torch.bool, device=device).tril(past)


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v read the 2H-wide concat of embeddings and hidden; the
    attention itself is the caller's `Attend` (SDPA over a `KVCache`, or the speculator's
    paged KV pool)."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            d,
        )
        self.q_proj = nn.Linear(2 * h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attend: Attend
    ) -> torch.Tensor:
        """x [B, T, 2H], rope (cos, sin) [B, T, head_dim] -> [B, T, H]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *rope)
        out = attend(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class CachedAttention:
    """The `Attend` of a forward over an explicit `KVCache`: SDPA over `past` then this call's
    keys under `mask` (bool [B or 1, T, S + T]); `new` holds this call's keys afterwards."""

    def __init__(self, past: KVCache | None, mask: torch.Tensor) -> None:
        self.past, self.mask = past, mask
        self.new: KVCache | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.new = KVCache(k, v)
        full = self.new if self.past is None else self.past.extend(self.new)
        return F.scaled_dot_product_attention(
            q, full.key, full.value, attn_mask=self.mask[:, None], enable_gqa=True
        )


class Eagle3DecoderLayer(nn.Module):
    """SGLang's input layer (`midlayer` / `layers.0`): residual is the fc output (or fed hidden)."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = LlamaMLP(config.to_llama_config())

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attend: Attend,
    ) -> torch.Tensor:
        """embeds, hidden [B, T, H] -> the pre-norm output [B, T, H]."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        residual = hidden + self.self_attn(x, rope, attend)
        return residual + self.mlp(self.post_attention_layernorm(residual))


class Eagle3Head(nn.Module):
    """An EAGLE-3 draft head; parameter names are the head file's (`midlayer.*`, `fc.weight`...).

    The target's embeddings (and its LM head when `draft_vocab_size` is None) are attached as
    non-persistent buffers by `attach_target`: they are the target's, not trained, not saved.
    """

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.config = config
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_norm = (
            LlamaRMSNorm(config.feature_size, eps=eps) if config.norm_before_fc else None
        )
        self.fc_norm = (
            nn.ModuleList(
                LlamaRMSNorm(config.target_hidden_size, eps=eps)
                for _ in range(config.num_aux_hidden_states)
            )
            if config.fc_norm
            else None
        )
        self.fc = nn.Linear(config.feature_size, h, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = LlamaRMSNorm(h, eps=eps)
        self.rotary_emb = LlamaRotaryEmbedding(config.to_llama_config())
        if config.draft_vocab_size is None:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        if config.own_embeddings:
            self.embed_tokens = nn.Embedding(config.vocab_size, h)
        else:
            self.embed_tokens = None
            self.register_buffer("target_embed_tokens", None, persistent=False)
        self.register_buffer("target_lm_head", None, persistent=False)

    def attach_target(
        self, embed_tokens: torch.Tensor | None, lm_head: torch.Tensor | None = None
    ) -> None:
        """Use the target's embeddings [V, H] (and, for a full-vocabulary head, LM head [V, H]).

        A head with `own_embeddings` takes None for `embed_tokens` (its own are loaded).

        Raises:
            ValueError: on shapes that do not match the config, or a full-vocabulary head
                without the target's LM head.
        """
        want = (self.config.vocab_size, self.config.hidden_size)
        if self.embed_tokens is not None:
            if embed_tokens is not None:
                raise ValueError("this head embeds with its own embed_tokens (target_hidden_size)")
        elif embed_tokens is None or tuple(embed_tokens.shape) != want:
            shape = None if embed_tokens is None else tuple(embed_tokens.shape)
            raise ValueError(f"target embed_tokens {shape}, head needs {want}")
        if self.lm_head is None:
            if lm_head is None or tuple(lm_head.shape) != want:
                shape = None if lm_head is None else tuple(lm_head.shape)
                raise ValueError(f"draft_vocab_size null needs the target lm_head {want}: {shape}")
            self.target_lm_head = lm_head
        if self.embed_tokens is None:
            self.target_embed_tokens = embed_tokens

    def target_token_ids(self) -> torch.Tensor:
        """int64 [lm_head_rows]: the target id of each logit column (d2t[i] + i; SGLang's
        `hot_token_id`)."""
        ids = torch.arange(self.config.lm_head_rows, device=self.fc.weight.device)
        return ids if self.lm_head is None else ids + self.d2t

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [..., n × target_hidden] -> fc input norms then fc -> [..., H]."""
        if self.input_norm is not None:
            features = self.input_norm(features)
        if self.fc_norm is not None:
            chunks = features.chunk(self.config.num_aux_hidden_states, dim=-1)
            normed = [norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)]
            features = torch.cat(normed, dim=-1)
        return self.fc(features)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        past: KVCache | None = None,
        mask: torch.Tensor | None = None,
    ) -> HeadOutput:
        """One head step over T tokens per row.

        Args:
            input_ids: int64 [B, T], target token ids (embedded with the target's embeddings).
            hidden: [B, T, n × target_hidden] target features (fc applied), or [B, T, H] the
                head's own `HeadOutput.hidden` of the step before (fed as is). The width says
                which, as in SGLang. In the head's dtype (cast bf16 target features to it).
            positions: int64 [B, T], RoPE positions.
            past: keys/values of earlier positions, [B, kv_heads, S, head_dim].
            mask: bool [B or 1, T, S + T] (True = attend); default `causal_mask(T, S)`.

        Returns:
            `HeadOutput` (logits, hidden fed back, this call's KV).

        Raises:
            ValueError: for a `hidden` width that is neither, or no target attached.
        """
        if self.embed_tokens is None and self.target_embed_tokens is None:
            raise ValueError("attach_target(...) first: the head uses the target's embeddings")
        width = hidden.shape[-1]
        if width == self.config.feature_size:
            hidden = self.project_features(hidden)
        elif width != self.config.hidden_size:
            raise ValueError(
                f"hidden width {width} is neither the features' {self.config.feature_size} "
                f"nor the head's {self.config.hidden_size}"
            )
        if mask is None:
            past_length = 0 if past is None else past.length
            mask = causal_mask(input_ids.shape[1], past_length, hidden.device)[None]
        attend = CachedAttention(past, mask)
        out, fed = self.step(input_ids, hidden, positions, attend)
        assert attend.new is not None
        return HeadOutput(self.logits(out), fed, attend.new)

    def step(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, attend: Attend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder layer over projected inputs: (pre-norm output, hidden fed back).

        Args:
            input_ids: int64 [B, T] target ids; hidden: [B, T, H], fc(features) or the head's
                own fed-back hidden; positions: int64 [B, T]; attend: the attention kernel.

        Returns:
            ([B, T, H] output before `norm` (`logits` takes it), [B, T, H] the hidden the
            next draft step feeds back: the output, or its norm with `norm_output`).
        """
        table = self.target_embed_tokens if self.embed_tokens is None else self.embed_tokens.weight
        embeds = F.embedding(input_ids, table).to(hidden.dtype)
        rope = self.rotary_emb(hidden, positions)
        out = self.midlayer(embeds, hidden, rope, attend)
        return out, self.norm(out) if self.config.norm_output else out

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., lm_head_rows] draft-vocabulary logits of `step`'s output [..., H]."""
        normed = self.norm(out)
        weight = self.target_lm_head if self.lm_head is None else self.lm_head.weight
        return F.linear(normed, weight.to(normed.dtype))

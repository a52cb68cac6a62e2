"""The draft model runtime: a Hugging Face causal LM whose attention reads/writes our KV pool.

Why transformers and not SGLang's ModelRunner: SGLang's runner cannot be driven from a second
process with a custom branch mask without its whole distributed/scheduler stack, whereas
transformers' model code (Qwen2/Llama family) is well kept and lets a registered attention
function receive extra keyword arguments. So the draft runs HF's own modules (embeddings, RoPE,
MLPs, norms) and only attention is ours: `_ssd_paged_attention`, registered with
`transformers.AttentionInterface` as "ssd_paged", writes the layer's new K/V (already RoPE'd by
the HF layer, at the logical positions we pass) into `KVPool` slots and attends with
`sglang_ssd_kernels.branch_attention` over the slots the `AttentionLayout` lists.

One `DraftModel.forward` is one batched model call over N query tokens of any number of
requests (prefill, glue decode or one tree-decode depth over all branches).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from sglang_ssd_kernels.branch_attention import BranchAttentionPlan, plan_branch_attention
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface

from sglang_ssd.phases import PhaseTimer
from sglang_ssd.speculator.draft_vocab import DraftVocab, eos_ids_of
from sglang_ssd.speculator.kv_pool import KVPool, affordable_slots, available_memory, slot_bytes

if TYPE_CHECKING:
    from sglang_ssd.runtime_registry import LoadRequest

ATTN_IMPLEMENTATION = "ssd_paged"
_CTX_KWARG = "ssd_ctx"


@dataclass(frozen=True)
class AttentionLayout:
    """Which pool slots each query token attends to (FlashInfer paged layout, page size 1).

    The speculator builds it with `packing.pack` from one segment per request.

    Attributes:
        qo_indptr: int32/int64 [R + 1]; segment r (one request) owns query rows
            qo_indptr[r]:qo_indptr[r + 1] of the forward.
        kv_indptr: int32/int64 [R + 1] into kv_indices.
        kv_indices: int32/int64 [total_kv], pool slots of every segment in order. A query that
            must see itself lists its own out_slot here (K/V are written before attending).
        custom_mask: bool [sum_r qo_len_r * kv_len_r], row-major [qo_len_r, kv_len_r] block per
            segment, True = may attend; None = every query sees its whole segment.
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None = None


@dataclass(frozen=True)
class HeadInputs:
    """What each of a forward's N rows reads besides its token.

    Attributes:
        prev_slots: int64 [N], the pool slot of each row's predecessor (position − 1) on its
            path; -1 for a row at position 0.
        features: [N, F] target features of each row's own position (F = n × target hidden),
            or None when no row has them; rows with `known` False are ignored.
        known: bool [N], which rows' features are given (None: none).
    """

    prev_slots: torch.Tensor
    features: torch.Tensor | None = None
    known: torch.Tensor | None = None


@dataclass
class _ForwardContext:
    """What every layer's attention call needs; built once per forward (the kwarg `ssd_ctx`)."""

    pool: KVPool
    out_slots: torch.Tensor
    plan: BranchAttentionPlan


def _ssd_paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF attention function: write this layer's K/V to the pool, then branch attention.

    Args (HF's attention-interface contract, batch 1):
        query: [1, H, N, d], key: [1, Hkv, N, d] (RoPE applied), value: [1, Hkv, N, dv].
        kwargs["ssd_ctx"]: the `_ForwardContext` of this forward.

    Returns:
        ([1, N, H, dv], None).
    """
    ctx: _ForwardContext | None = kwargs.get(_CTX_KWARG)
    if ctx is None:
        raise RuntimeError("the ssd_paged attention needs DraftModel.forward (no ssd_ctx given)")
    if sliding_window is not None:
        raise NotImplementedError("sliding-window layers are not supported by the draft runtime")
    layer = module.layer_idx
    k_cache, v_cache = ctx.pool.k[layer], ctx.pool.v[layer]
    k_cache.index_copy_(0, ctx.out_slots, key[0].transpose(0, 1))
    v_cache.index_copy_(0, ctx.out_slots, value[0].transpose(0, 1))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = ctx.plan.run(query[0].transpose(0, 1), k_cache, v_cache, scale)
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, _ssd_paged_attention)
# The layout carries the mask; HF must not build one (None skips its mask creation).
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, lambda *args, **kwargs: None)


class DraftModel:
    """A causal LM (Qwen2/Llama family) run over a paged KV pool with branch attention.

    Build with `DraftModel.load`. Attributes:
        hf: the transformers model (attention implementation "ssd_paged").
        kv_pool: the model's `KVPool`.
        forward_count: number of `forward` calls so far (one batched model call each).
        phases: seconds by phase; each `forward` adds its body under its `phase` name and its
            LM head under ``lm_head``, and the engine adds sampling, lookup, populate, ...
    """

    uses_features = False  # an EAGLE-3 head reads the target's features (`HeadDraftModel`)
    owns_vocab = False  # takes `--ssd-draft-vocab` through `use_vocab`

    def __init__(self, hf_model: torch.nn.Module, kv_pool: KVPool) -> None:
        config = hf_model.config
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            raise NotImplementedError("draft models with sliding-window layers are not supported")
        self.hf = hf_model.eval()
        self.config = config
        self.kv_pool = kv_pool
        self.base = getattr(hf_model, hf_model.base_model_prefix)
        self.lm_head = hf_model.get_output_embeddings()
        self.device = next(hf_model.parameters()).device
        self.dtype = next(hf_model.parameters()).dtype
        self.forward_count = 0
        self.phases = PhaseTimer.for_device(self.device)
        self.vocab: DraftVocab | None = None
        self._head_weight: torch.Tensor | None = None  # lm_head rows of `vocab.ids`
        self._head_ids: torch.Tensor | None = None  # `vocab.ids` on the model's device

    def use_vocab(self, vocab: DraftVocab | None) -> None:
        """Restrict the LM head to `vocab` (None: the full vocabulary again).

        Every later `forward` computes logits for `vocab.ids` only and gives every other id
        -inf, so sampling, argmax and fork candidates stay inside the kept ids and q is zero
        outside them (`draft_vocab`); fork candidates do too while N >= the candidates asked
        for. Costs one copy of those lm_head rows (N × hidden). A vocabulary of every id is the
        full head (None).

        Raises:
            ValueError: when `vocab.vocab_size` differs from the model's V.
        """
        if vocab is not None and vocab.vocab_size != self.vocab_size:
            raise ValueError(
                f"draft vocabulary for V={vocab.vocab_size}, model has {self.vocab_size}"
            )
        if vocab is not None and vocab.size == self.vocab_size:
            vocab = None
        self.vocab = vocab
        self._head_weight = self._head_ids = None
        if vocab is not None:
            self._head_ids = vocab.ids.to(self.device)
            weight = self.lm_head.weight.detach()
            self._head_weight = weight.index_select(0, self._head_ids).contiguous()

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        num_slots: int = 16384,
        num_threads: int | None = None,
        memory_share: float | None = None,
    ) -> DraftModel:
        """Load an HF causal-LM folder (config.json + safetensors) as a draft model.

        Args:
            path: the model folder.
            device: where the weights and the KV pool live ("cpu", "cuda:0", ...).
            dtype: weight and KV dtype.
            num_slots: KV pool capacity in tokens (all requests and branches together).
            num_threads: if given, `torch.set_num_threads(num_threads)` for this process.
            memory_share: if given, fewer slots when `num_slots` would take more than this
                share of the memory the device has free once the weights are loaded
                (`kv_pool.affordable_slots`); `kv_pool.num_slots` says how many it got.

        Raises:
            FileNotFoundError: if `path` has no config.json.
            NotImplementedError: for models with sliding-window attention layers.
        """
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no HF model folder at {path} (config.json missing)")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        hf_model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION
        ).to(device)
        config = hf_model.config
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        if memory_share is not None:
            per_slot = slot_bytes(
                config.num_hidden_layers, config.num_key_value_heads, head_dim, dtype
            )
            num_slots = affordable_slots(
                num_slots, per_slot, available_memory(device), memory_share
            )
        pool = KVPool(
            num_layers=config.num_hidden_layers,
            num_slots=num_slots,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )
        return cls(hf_model, pool)

    @classmethod
    def create(cls, request: LoadRequest) -> DraftModel:
        """The "torch" draft runtime (`speculator.runtimes`): `load` with `request`'s folder,
        device, dtype, pool size and memory share. Raises as `load`."""
        return cls.load(
            request.model_path,
            device=request.device,
            dtype=getattr(torch, request.dtype),
            num_slots=request.kv_slots,
            memory_share=request.memory_share,
        )

    @property
    def vocab_size(self) -> int:
        """V, the logits' width (the lm_head's rows; may exceed the tokenizer's size)."""
        return int(self.lm_head.weight.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """End-of-sequence ids from the config and the generation config (deduplicated)."""
        return eos_ids_of(self.config, getattr(self.hf, "generation_config", None))

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_slots: torch.Tensor,
        layout: AttentionLayout,
        logits_rows: torch.Tensor | None = None,
        phase: str = "forward",
        head_inputs: HeadInputs | None = None,
    ) -> torch.Tensor:
        """One batched model call over N query tokens.

        Each layer first writes the new tokens' K/V at `out_slots`, then every query attends to
        the slots `layout` gives it (so a token sees itself when its own slot is listed).

        Args:
            input_ids: int64 [N] token ids.
            positions: int64 [N] logical positions (RoPE), independent of slots.
            out_slots: int64 [N] distinct allocated pool slots for the new K/V.
            layout: the attention layout over N queries.
            logits_rows: int64 [M] rows of the N whose logits are wanted, or None (all N). Only
                these rows go through the lm_head (V = 151,936 makes it the costliest layer).
            phase: the name `phases` records the call's body under (``glue``, ``tree_1``, ...).
            head_inputs: what an EAGLE-3 head reads (`head_model`); a causal LM ignores it.

        Returns:
            float32 [M or N, V] logits (computed in the model dtype, then widened; -inf outside
            the reduced vocabulary of `use_vocab`, when one is set). They are
            inference tensors (torch.inference_mode): copy them (`.clone()`) before modifying
            them in place outside inference mode.

        Raises:
            ValueError: on mismatched lengths, an empty forward, or (pool debug mode) an
                out_slot that is not allocated.
        """
        n = input_ids.numel()
        if n == 0:
            raise ValueError("DraftModel.forward needs at least one token")
        if positions.numel() != n or out_slots.numel() != n:
            raise ValueError(
                f"input_ids [{n}], positions [{positions.numel()}], out_slots "
                f"[{out_slots.numel()}] must have the same length"
            )
        if self.kv_pool.debug and not bool(self.kv_pool.is_allocated(out_slots).all()):
            raise ValueError("DraftModel.forward: out_slots include slots that are not allocated")
        device = self.device
        plan = plan_branch_attention(
            layout.qo_indptr,
            layout.kv_indptr,
            layout.kv_indices,
            layout.custom_mask,
            device=device,
        )
        if plan.num_queries != n:
            raise ValueError(f"layout describes {plan.num_queries} queries, forward has {n}")
        ctx = _ForwardContext(
            pool=self.kv_pool,
            out_slots=out_slots.to(device=device, dtype=torch.int64),
            plan=plan,
        )
        self.forward_count += 1
        with self.phases.phase(phase):
            hidden = self.base(
                input_ids=input_ids.to(device=device, dtype=torch.int64).view(1, n),
                position_ids=positions.to(device=device, dtype=torch.int64).view(1, n),
                use_cache=False,
                **{_CTX_KWARG: ctx},
            ).last_hidden_state[0]
        with self.phases.phase("lm_head"):
            if logits_rows is not None:
                hidden = hidden.index_select(0, logits_rows.to(device=device, dtype=torch.int64))
            return self._logits(hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 [M, V] logits of `hidden` [M, hidden]; -inf outside a reduced vocabulary."""
        if self._head_weight is None or self._head_ids is None:
            return self.lm_head(hidden).float()
        bias = getattr(self.lm_head, "bias", None)
        ids = self._head_ids
        kept = torch.nn.functional.linear(
            hidden, self._head_weight, None if bias is None else bias[ids]
        ).float()
        out = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        return out.index_copy_(1, ids, kept)

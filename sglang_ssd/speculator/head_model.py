"""An EAGLE-3 head as a draft runtime over the speculator's paged KV pool (`HeadDraftModel`).

The head's one decoder layer (`eagle3.Eagle3Head.step`, SGLang's `LlamaForCausalLMEagle3`
math) runs with the same `forward(input_ids, positions, out_slots, layout, ...)` contract as
`draft_model.DraftModel`, so packing, branch attention and the speculation cache serve it
unchanged (paper §4; EAGLE-3, Li et al. 2025). What a head needs beyond a causal LM is the
hidden each row reads (`HeadInputs`):

- Row i of a request feeds token s[i] at position i with the hidden of position i − 1: fc of the
  target's features f_{i−1} when the target has sent them, else the head's own fed-back hidden
  of row i − 1 (the not yet verified positions of a draft or branch). RoPE is relative, so
  feeding at i instead of SGLang's i − 1 changes nothing.
- That hidden lives per pool slot in `slot_hidden` [num_slots, H]: a row writes fc(f_i) there
  when its own features are known, else its fed-back hidden; a successor row reads the slot of
  its predecessor (`HeadInputs.prev_slots`). A forward first writes every row's fc(f_i), so a
  row may follow a predecessor of the same forward only when that predecessor's features are
  known (committed tokens); a drafted predecessor needs a forward of its own.
- Row 0 (the first token) has no predecessor: it reads zeros, and its slot is "dead": no other
  query attends to it, as no head sees a row without features in training or in SGLang.

Logits come back over the target's V (-inf outside the head's draft vocabulary, whose ids are
`Eagle3Head.target_token_ids`), so q is zero there and verification stays exact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from sglang_ssd_kernels.branch_attention import plan_branch_attention

from sglang_ssd.eagle3 import Eagle3Head, load_head
from sglang_ssd.eagle3.load import target_tensors
from sglang_ssd.phases import PhaseTimer
from sglang_ssd.speculator.draft_model import AttentionLayout, HeadInputs
from sglang_ssd.speculator.draft_vocab import DraftVocab
from sglang_ssd.speculator.kv_pool import KVPool, affordable_slots, available_memory, slot_bytes

if TYPE_CHECKING:
    from sglang_ssd.runtime_registry import LoadRequest

EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


def drop_dead_keys(
    layout: AttentionLayout, dead: torch.Tensor, out_slots: torch.Tensor
) -> torch.Tensor:
    """The layout's mask (bool, flat, as `AttentionLayout.custom_mask`) with every key at a dead
    slot hidden, except from the query written there (a query always sees itself).

    Args:
        layout: the forward's layout (its `custom_mask` None means all visible).
        dead: bool [num_slots], slots whose rows no other query may read.
        out_slots: int64 [N], the slot each query writes.
    """
    qo = layout.qo_indptr.tolist()
    kv = layout.kv_indptr.tolist()
    blocks = []
    for r in range(len(qo) - 1):
        keys = layout.kv_indices[kv[r] : kv[r + 1]].to(torch.int64)
        own = out_slots[qo[r] : qo[r + 1]]
        visible = ~dead[keys].unsqueeze(0) | (keys.unsqueeze(0) == own.unsqueeze(1))
        if layout.custom_mask is not None:
            start = sum((qo[j + 1] - qo[j]) * (kv[j + 1] - kv[j]) for j in range(r))
            block = layout.custom_mask[start : start + visible.numel()].view_as(visible)
            visible = visible & block
        blocks.append(visible.reshape(-1))
    return torch.cat(blocks)


class HeadDraftModel:
    """An `Eagle3Head` over a one-layer `KVPool` (see the module docstring).

    Attributes:
        head: the head, the target's embeddings (and LM head for a full-vocabulary head)
            attached.
        kv_pool: the head layer's K/V slots.
        slot_hidden: [num_slots, H], the hidden a successor of each slot's row reads.
        dead: bool [num_slots], slots of rows at position 0.
        vocab: the draft vocabulary (the head's target ids) over the target's V.
        forward_count, phases: as `DraftModel`'s.
    """

    uses_features = True
    owns_vocab = True  # the head's own vocabulary (its target ids)

    def __init__(self, head: Eagle3Head, kv_pool: KVPool) -> None:
        self.head = head.eval()
        self.config = head.config
        self.kv_pool = kv_pool
        param = head.fc.weight
        self.device, self.dtype = param.device, param.dtype
        self.slot_hidden = torch.zeros(
            kv_pool.num_slots, self.config.hidden_size, dtype=self.dtype, device=self.device
        )
        self.dead = torch.zeros(kv_pool.num_slots, dtype=torch.bool, device=self.device)
        ids = head.target_token_ids()
        self._order = torch.argsort(ids)  # logit columns in ascending target id
        self.vocab = DraftVocab(
            ids[self._order].cpu(), int(self.config.vocab_size), "the EAGLE-3 head's vocabulary"
        )
        self._ids = self.vocab.ids.to(self.device)
        self.forward_count = 0
        self.phases = PhaseTimer.for_device(self.device)

    @classmethod
    def create(cls, request: LoadRequest) -> HeadDraftModel:
        """The "eagle3-head" draft runtime (`speculator.runtimes`): `load` with `request`'s
        folders, device, dtype, pool size and memory share.

        Raises:
            ValueError: without the target's folder (the head reads its embeddings), or as
                `load`.
        """
        if not request.target_model_path:
            raise ValueError(
                f"{request.model_path} is an EAGLE-3 head: it needs the target's folder "
                "(--target-model-path)"
            )
        return cls.load(
            request.model_path,
            request.target_model_path,
            request.device,
            getattr(torch, request.dtype),
            request.kv_slots,
            request.memory_share,
        )

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        target_path: str | os.PathLike[str],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        num_slots: int = 16384,
        memory_share: float | None = None,
    ) -> HeadDraftModel:
        """Load a head folder (`eagle3.load_head`, strict) and the target's embeddings (and LM
        head, for a head without its own) from the target's folder.

        Args:
            path: the head folder; target_path: the target model folder it was trained for.
            device, dtype, num_slots, memory_share: as `DraftModel.load`.

        Raises:
            ValueError: an unsupported or mismatched head (`load_head`, `attach_target`).
            FileNotFoundError, KeyError: a target folder without its embeddings.
        """
        head = load_head(path, dtype=dtype, device=device)
        config = head.config
        target_config = json.loads((Path(target_path) / "config.json").read_text())
        tied = bool(target_config.get("tie_word_embeddings", False))
        names = [] if config.own_embeddings else [EMBED]
        if head.lm_head is None:
            names.append(EMBED if tied else LM_HEAD)
        found = target_tensors(target_path, sorted(set(names)))
        weights = {k: v.to(device=device, dtype=dtype) for k, v in found.items()}
        lm = weights.get(EMBED if tied else LM_HEAD) if head.lm_head is None else None
        head.attach_target(weights.get(EMBED), lm)
        if memory_share is not None:
            per_slot = slot_bytes(1, config.num_key_value_heads, config.head_dim, dtype)
            per_slot += config.hidden_size * dtype.itemsize
            num_slots = affordable_slots(
                num_slots, per_slot, available_memory(device), memory_share
            )
        pool = KVPool(1, num_slots, config.num_key_value_heads, config.head_dim, dtype, device)
        return cls(head, pool)

    @property
    def vocab_size(self) -> int:
        """V, the target's logit width (the head's `vocab_size`)."""
        return int(self.config.vocab_size)

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
        """One batched head step over N rows (`DraftModel.forward`'s contract plus the hidden
        each row reads).

        Args:
            input_ids, positions, out_slots, layout, logits_rows, phase: as `DraftModel.forward`.
            head_inputs: each row's predecessor slot and own target features (required).

        Returns:
            float32 [M or N, V] logits over the target's ids, -inf outside the head's vocabulary.

        Raises:
            ValueError: without `head_inputs`, on mismatched lengths, or a row whose predecessor
                is written by this same forward without known features.
        """
        n = input_ids.numel()
        if head_inputs is None:
            raise ValueError("an EAGLE-3 head's forward needs HeadInputs (predecessor slots)")
        if n == 0 or positions.numel() != n or out_slots.numel() != n:
            raise ValueError("input_ids, positions and out_slots must be non-empty, same length")
        dev = self.device
        out_slots = out_slots.to(device=dev, dtype=torch.int64)
        prev = head_inputs.prev_slots.to(device=dev, dtype=torch.int64)
        known = head_inputs.known
        known = torch.zeros(n, dtype=torch.bool, device=dev) if known is None else known.to(dev)
        if bool(torch.isin(prev, out_slots[~known]).any()):
            raise ValueError("a row's predecessor is drafted in the same forward (no features)")
        self.forward_count += 1
        head = self.head
        with self.phases.phase(phase):
            if bool(known.any()):
                assert head_inputs.features is not None
                feats = head_inputs.features.to(device=dev, dtype=self.dtype)[known]
                self.slot_hidden[out_slots[known]] = head.project_features(feats)
            hidden = self.slot_hidden[prev.clamp(min=0)]
            hidden[prev < 0] = 0
            self.dead[out_slots] = prev < 0
            plan = plan_branch_attention(
                layout.qo_indptr,
                layout.kv_indptr,
                layout.kv_indices,
                drop_dead_keys(layout, self.dead, out_slots),
                device=dev,
            )
            if plan.num_queries != n:
                raise ValueError(f"layout describes {plan.num_queries} queries, forward has {n}")
            k_cache, v_cache = self.kv_pool.k[0], self.kv_pool.v[0]

            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                k_cache.index_copy_(0, out_slots, k[0].transpose(0, 1))
                v_cache.index_copy_(0, out_slots, v[0].transpose(0, 1))
                out = plan.run(q[0].transpose(0, 1), k_cache, v_cache, q.shape[-1] ** -0.5)
                return out.transpose(0, 1).unsqueeze(0)

            out, fed = head.step(
                input_ids.to(device=dev, dtype=torch.int64).view(1, n),
                hidden.unsqueeze(0),
                positions.to(device=dev, dtype=torch.int64).view(1, n),
                attend,
            )
            self.slot_hidden[out_slots[~known]] = fed[0][~known]
        with self.phases.phase("lm_head"):
            out = out[0]
            if logits_rows is not None:
                out = out.index_select(0, logits_rows.to(device=dev, dtype=torch.int64))
            kept = head.logits(out).float()[:, self._order]
            full = torch.full((out.shape[0], self.vocab_size), float("-inf"), device=dev)
            return full.index_copy_(1, self._ids, kept)

"""Draft runtimes: what runs the speculator's forwards, chosen by `--ssd-draft-runtime`.

The contract (`DraftRuntime`) is what `SpeculatorEngine`, the packing and the server really use
of a draft: its KV pool, device, vocabulary, one batched forward over packed rows, a forward
count and phase timer, and whether it reads the target's features. Three runtimes implement it:
- "torch": `speculator.draft_model.DraftModel`, a transformers causal LM (bf16 by default) whose
  attention reads and writes our paged pool (the default for a model folder on a GPU);
- "torch-int8": `speculator.int8_model.Int8DraftModel`, the same with int8 linear layers on
  torch's FBGEMM kernels (the default for a model folder on the CPU);
- "eagle3-head": `speculator.head_model.HeadDraftModel`, an EAGLE-3 head over the target's
  features and embeddings (the default for a head folder; `eagle3.is_eagle3_head`).
A new runtime is one module with a class implementing `DraftRuntime` and a
`create(LoadRequest)` classmethod, plus one `RuntimeEntry` line in `sglang_ssd.runtime_registry`
(the registry of names, which `--ssd-draft-runtime`'s choices come from). A runtime's module is
imported only when it is chosen.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Protocol

from sglang_ssd.runtime_registry import (
    AUTO,
    HEAD_RUNTIME,
    INT8_RUNTIME,
    NAMES,
    RUNTIMES,
    LoadRequest,
)

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

    from sglang_ssd.phases import PhaseTimer
    from sglang_ssd.speculator.draft_model import AttentionLayout, HeadInputs
    from sglang_ssd.speculator.draft_vocab import DraftVocab
    from sglang_ssd.speculator.kv_pool import KVPool


class DraftRuntime(Protocol):
    """What the speculator uses of a draft runtime.

    Attributes:
        uses_features: whether its forwards read the target's features (`HeadInputs.features`;
            the target then ships them with each Step).
        owns_vocab: whether it brings its own draft vocabulary (`--ssd-draft-vocab` is then
            ignored); a runtime without one also implements `draft_vocab.VocabModel`
            (`use_vocab`, `eos_token_ids`), through which the speculator installs
            `--ssd-draft-vocab`'s.
        kv_pool: its KV slots (`KVPool`): the engine allocates and frees them per branch.
        device: where its weights, pool and logits live.
        vocab: the draft vocabulary in force (None: every id).
        forward_count: `forward` calls so far.
        phases: seconds by phase; `forward` records its body under its `phase` and the LM head
            under ``lm_head``.
    """

    uses_features: bool
    owns_vocab: bool
    kv_pool: KVPool
    device: torch.device
    vocab: DraftVocab | None
    forward_count: int
    phases: PhaseTimer

    @property
    def vocab_size(self) -> int:
        """V, the width of its logits."""
        ...

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
        """One batched call over N rows (int64 [N] ids, positions and pool slots; `layout` says
        what each row attends to); float32 [M or N, V] logits of `logits_rows` (None: all)."""
        ...


def resolve(name: str, model_path: str, device: str = "cpu") -> str:
    """The runtime `name` means for the draft folder `model_path` on `device`: "auto" is
    "eagle3-head" for an EAGLE-3 head folder; for a model folder it is "torch-int8" on a CPU
    with torch's FBGEMM kernels (the fastest there: docs/benchmarks.md#draft-runtimes) and "torch"
    elsewhere, logging why.

    Raises:
        ValueError: an unknown name, or a runtime that cannot load the folder (a head folder
            for another runtime, a model folder for the head runtime).
    """
    from sglang_ssd.eagle3.config import is_eagle3_head

    if name not in NAMES:
        raise ValueError(f"unknown draft runtime {name!r}; known: {', '.join(NAMES)}")
    head = is_eagle3_head(model_path)
    if name == AUTO:
        if head:
            return HEAD_RUNTIME
        try:
            from sglang_ssd.speculator.int8_model import int8_unavailable
        except ImportError as exc:  # a torch without torch.ao.quantization's dynamic layers
            reason: str | None = f"torch-int8 needs torch.ao.quantization: {exc}"
        else:
            reason = int8_unavailable(device)
        if reason is None:
            return INT8_RUNTIME
        logger.info("draft runtime: torch (%s)", reason)
        return "torch"
    if head != (name == HEAD_RUNTIME):
        what = "an EAGLE-3 head" if head else "not an EAGLE-3 head"
        raise ValueError(
            f"--ssd-draft-runtime {name} cannot load {model_path}: it is {what} "
            f"(--ssd-draft-runtime {AUTO} picks the runtime from the folder)"
        )
    return name


def create_draft_runtime(name: str, request: LoadRequest) -> DraftRuntime:
    """The runtime `name` (resolved by `resolve`) built from `request`.

    Raises:
        ValueError: as `resolve`, or from the runtime's `create` (e.g. a head without the
            target's folder).
        FileNotFoundError: a folder without config.json.
    """
    entry = RUNTIMES[resolve(name, request.model_path, request.device)]
    module, cls = entry.target.split(":")
    return getattr(importlib.import_module(module), cls).create(request)

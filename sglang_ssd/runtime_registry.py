"""The draft runtime registry: the names `--ssd-draft-runtime` chooses from, and where each lives.

Each entry names the class that implements `sglang_ssd.speculator.runtimes.DraftRuntime`
("module:Class", imported only when chosen, by `speculator.runtimes.create_draft_runtime`, which
holds the contract and the loading). Standard library only, so that `sglang_ssd.config` and the
target side can list the names without importing torch or the speculator.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class LoadRequest:
    """What a runtime is built from.

    Attributes:
        model_path: the draft folder (`--speculative-draft-model-path`).
        target_model_path: the target's folder (a head reads the target's embeddings), or None.
        device: "cpu" or "cuda:N".
        dtype: the weights' and KV pool's dtype, by torch name ("bfloat16", ...).
        kv_slots: KV pool capacity asked for, in tokens.
        memory_share: the share of the device's free memory the pool may take at most.
    """

    model_path: str
    target_model_path: str | None
    device: str
    dtype: str
    kv_slots: int
    memory_share: float


@dataclass(frozen=True)
class RuntimeEntry:
    """One registered runtime: its `--ssd-draft-runtime` name, the class implementing it
    ("module:Class", imported when chosen; `Class.create(LoadRequest)` builds it), and one line
    for the flag's help."""

    name: str
    target: str
    summary: str


RUNTIMES: dict[str, RuntimeEntry] = {
    entry.name: entry
    for entry in (
        RuntimeEntry(
            "torch",
            "sglang_ssd.speculator.draft_model:DraftModel",
            "a transformers causal LM over the paged KV pool",
        ),
        RuntimeEntry(
            "torch-int8",
            "sglang_ssd.speculator.int8_model:Int8DraftModel",
            "the torch runtime with int8 weights (FBGEMM; CPU only)",
        ),
        RuntimeEntry(
            "eagle3-head",
            "sglang_ssd.speculator.head_model:HeadDraftModel",
            "an EAGLE-3 head reading the target's features",
        ),
    )
}
HEAD_RUNTIME = "eagle3-head"
INT8_RUNTIME = "torch-int8"
NAMES: tuple[str, ...] = (AUTO, *RUNTIMES)

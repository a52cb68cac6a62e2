"""A tiny target/draft pair that really speculates, trained on the fly in seconds.

Random tiny models are degenerate for SSD tests: greedily they repeat the last prompt token
forever and the draft agrees with the target on every token, so a wrong root token, an
off-by-one bonus row, wrong RoPE positions or the wrong branch's KV would all go unnoticed.
This pair is trained (float32, seeded, one thread, deterministic algorithms) on the procedural
corpus of `sglang_ssd.testing.corpus`: the target for `TARGET_STEPS` optimiser steps, the draft
(one layer fewer) for fewer steps, so their greedy outputs vary and agree only in part.
`sglang_ssd.testing.pair_stats` measures that they do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from sglang_ssd.testing.corpus import tiny_corpus
from sglang_ssd.testing.tiny_models import TinySpec, make_tiny_model, tokenize

TARGET_STEPS = 600
DRAFT_STEPS = 200
SEQ_LEN = 96
BATCH = 16
LEARNING_RATE = 3e-3
STAMP = "trained.json"


@dataclass(frozen=True)
class TrainSpec:
    """How one tiny model of the pair is trained.

    Attributes:
        model: its shape and init seed.
        steps: AdamW steps over random windows of the corpus.
        seed: seeds the window sampler (independent of the init seed).
    """

    model: TinySpec
    steps: int
    seed: int


TARGET = TrainSpec(TinySpec(num_layers=2, seed=0), steps=TARGET_STEPS, seed=10)
DRAFT = TrainSpec(TinySpec(num_layers=1, seed=1), steps=DRAFT_STEPS, seed=11)


def train_tiny(path: str | Path, spec: TrainSpec, corpus: str | None = None) -> Path:
    """Write a tiny Qwen2 to `path` and train it in place on `corpus` (default `tiny_corpus()`).

    Skips the work when `path` already holds a model trained with the same spec (a stamp file).
    Training runs on one thread with deterministic algorithms, so a machine reproduces its own
    result; other CPUs may round differently, which is why `pair_stats` checks properties, not
    exact weights.

    Returns:
        `path`.
    """
    from transformers import AutoModelForCausalLM

    path = Path(path)
    stamp = path / STAMP
    record = {"spec": repr(spec)}
    if stamp.exists() and json.loads(stamp.read_text()) == record:
        return path
    make_tiny_model(path, spec.model)
    ids = torch.tensor(tokenize(corpus if corpus is not None else tiny_corpus()), dtype=torch.long)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        _fit(model, ids, spec)
        model.save_pretrained(path)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    stamp.write_text(json.dumps(record))
    return path


def _fit(model: torch.nn.Module, ids: torch.Tensor, spec: TrainSpec) -> None:
    """Next-token cross-entropy on random windows of `ids` (int64 [N])."""
    generator = torch.Generator().manual_seed(spec.seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    model.train()
    for _ in range(spec.steps):
        starts = torch.randint(0, ids.numel() - SEQ_LEN, (BATCH,), generator=generator)
        windows = torch.stack([ids[s : s + SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=windows, labels=windows).loss  # HF shifts the labels
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()


def make_trained_pair(root: str | Path) -> tuple[Path, Path]:
    """Train (or reuse) the target and draft under `root`; returns (target, draft) folders."""
    root = Path(root)
    return train_tiny(root / "target", TARGET), train_tiny(root / "draft", DRAFT)


def with_steps(spec: TrainSpec, steps: int) -> TrainSpec:
    """`spec` trained for `steps` instead (for experiments that tune the pair)."""
    return replace(spec, steps=steps)

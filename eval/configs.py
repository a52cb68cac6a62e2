"""Named configurations (data): builders for the usual servers and a JSON loader.

Later experiments add configurations here or in a JSON file (`python -m eval run --configs`),
not new harness code. Every builder spells out the flags that matter for a fair comparison
(model paths, dtype, γ, top-k, draft tokens) instead of relying on launcher defaults, so the
results JSON records them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from eval.harness import Config

DTYPE = "bfloat16"
# KV pool size (tokens) for eval servers: prompts here are < 500 tokens, so 8192 covers batch 8
# at 128 new tokens while keeping two real servers within this machine's 24 GB.
MAX_TOTAL_TOKENS = 8192


def default_model_dirs() -> tuple[Path, Path]:
    """The real target and draft folders; raises `ModelNotFoundError` (never pulls)."""
    from sglang_ssd.models import DRAFT_MODEL, TARGET_MODEL, model_path

    return model_path(TARGET_MODEL, pull=False), model_path(DRAFT_MODEL, pull=False)


def autoregressive(
    target: Path | str,
    *,
    name: str = "AR",
    cpus: Sequence[int] | None = None,
    threads: int | None = None,
    extra: Sequence[str] = (),
) -> Config:
    """Plain decoding of the target (`--speculative-algorithm NONE`)."""
    args = _target_args(target, "NONE")
    return Config(name, (*args, *extra), _cpus(cpus), threads)


def standalone(
    target: Path | str,
    draft: Path | str,
    *,
    name: str = "STANDALONE",
    lookahead: int = 4,
    topk: int = 1,
    cpus: Sequence[int] | None = None,
    threads: int | None = None,
    extra: Sequence[str] = (),
) -> Config:
    """SGLang's own draft-model speculative decoding: chain of γ draft tokens (top-k 1)."""
    args = (
        *_target_args(target, "STANDALONE"),
        *_chain_draft_args(draft, lookahead, str(topk)),
    )  # fmt: skip
    notes = "SGLang's verify is greedy on CPU: not lossless at temperature > 0"
    return Config(name, (*args, *extra), _cpus(cpus), threads, notes=notes)


def ssd(
    target: Path | str,
    draft: Path | str,
    *,
    name: str = "SSD",
    mode: str = "async",
    lookahead: int = 4,
    cpus: Sequence[int] | None = None,
    draft_cpus: Sequence[int] | None = None,
    threads: int | None = None,
    extra: Sequence[str] = (),
) -> Config:
    """This package's SSD (`--ssd-mode async`) or its synchronous-SD baseline (`sync`).

    On CPU the server is pinned to `cpus`; the speculator takes `draft_cpus` out of them (None:
    the launcher's split, i.e. the last core, or the only core shared when `cpus` has one).
    """
    args = (
        *_target_args(target, "SSD"),
        *_chain_draft_args(draft, lookahead, "1"),
        "--ssd-mode", mode,
    )  # fmt: skip
    if draft_cpus:
        args = (*args, "--ssd-draft-cpus", ",".join(map(str, draft_cpus)))
    return Config(name, (*args, *extra), _cpus(cpus), threads)


def baseline(
    target: Path | str, draft: Path | str, *, lookahead: int = 4, pinned_cpus: Sequence[int] = ()
) -> list[Config]:
    """AR vs STANDALONE; with `pinned_cpus`, each server (target and draft) on those CPUs."""
    cpus = tuple(pinned_cpus) or None
    threads = len(cpus) if cpus else None
    return [
        autoregressive(target, cpus=cpus, threads=threads),
        standalone(target, draft, lookahead=lookahead, cpus=cpus, threads=threads),
    ]


def load_configs(path: Path) -> list[Config]:
    """Configurations from a JSON list of `Config.to_dict()`-shaped objects."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        data = data["configs"]
    return [Config.from_dict(d) for d in data]


def _target_args(target: Path | str, algorithm: str) -> tuple[str, ...]:
    """The flags every configuration pins: target, dtype, KV pool and the algorithm."""
    return (
        "--model-path", str(target),
        "--dtype", DTYPE,
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
        "--speculative-algorithm", algorithm,
    )  # fmt: skip


def _chain_draft_args(draft: Path | str, lookahead: int, topk: str) -> tuple[str, ...]:
    """Draft model and γ: γ steps of top-k drafting, γ + 1 tokens verified."""
    return (
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(lookahead),
        "--speculative-eagle-topk", topk,
        "--speculative-num-draft-tokens", str(lookahead + 1),
    )  # fmt: skip


def _cpus(cpus: Sequence[int] | None) -> tuple[int, ...] | None:
    return tuple(cpus) if cpus else None

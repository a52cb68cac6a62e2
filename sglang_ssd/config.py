"""`SSDConfig`: every `--ssd-*` flag, validated once, shared with SGLang's subprocesses.

SGLang has no API for a plugin to add CLI flags, so `sglang_ssd.launch_server` parses the
`--ssd-*` flags itself (`add_ssd_args`, `SSDConfig.from_namespace`) and hands the result to the
scheduler subprocess through the `SGLANG_SSD_CONFIG` environment variable (`to_env` /
`from_env`). This module imports nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Literal

ENV_VAR = "SGLANG_SSD_CONFIG"

Mode = Literal["async", "sync"]
FanoutShape = Literal["geometric", "uniform"]
BackupChoice = Literal["jit", "ngram", "random", "auto"]

MODES: tuple[str, ...] = ("async", "sync")
FANOUT_SHAPES: tuple[str, ...] = ("geometric", "uniform")
BACKUPS: tuple[str, ...] = ("jit", "ngram", "random", "auto")
_DEVICE_RE = re.compile(r"^(cpu|cuda:\d+)$")


class SSDConfigError(ValueError):
    """An `--ssd-*` value (or a combination with SGLang's flags) that SSD cannot run with."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse a Linux-style CPU list such as ``"1"``, ``"0-3"`` or ``"0,2-3"``.

    Returns:
        The sorted, de-duplicated CPU ids.

    Raises:
        SSDConfigError: on an empty list, a malformed item, a negative id or a reversed range.
    """
    cpus: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not match:
            raise SSDConfigError(f"--ssd-draft-cpus: {item!r} is not a CPU id or range (e.g. 1-3)")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if hi < lo:
            raise SSDConfigError(f"--ssd-draft-cpus: range {item!r} is reversed")
        cpus.update(range(lo, hi + 1))
    if not cpus:
        raise SSDConfigError("--ssd-draft-cpus: empty CPU list")
    return tuple(sorted(cpus))


@dataclass(frozen=True)
class SSDConfig:
    """Settings of SSD / Saguaro, one field per `--ssd-*` flag (plus γ from SGLang).

    Attributes:
        lookahead: γ, the number of draft tokens per round; copied from SGLang's
            `--speculative-num-steps`, never set by its own flag.
        mode: ``async`` pre-speculates the next round while the target verifies (SSD);
            ``sync`` drafts only when asked (the synchronous-SD baseline on the same machinery).
        tree_depth: D ≤ γ, tokens pre-speculated per cache branch (DESIGN.md §1); None means γ.
        fanout_budget: B, total number of cached outcomes per request per round (Σ F_k).
        fanout: how B is spread over accepted lengths k = 0..γ: ``geometric`` (Theorem 12) or
            ``uniform``.
        beta: Saguaro sampling down-weighting β ∈ (0, 1] (Definition 14); 1 disables it.
        backup: cache-miss fallback: ``jit`` (primary draft just in time), ``ngram``,
            ``random``, or ``auto`` (batch-size aware, Theorem 17).
        batch_threshold: b*, the batch size from which ``auto`` uses the fast backup; None lets
            the speedup model derive it from measured latencies.
        draft_device: the speculator's device, ``cpu`` or ``cuda:N``; None picks ``cpu`` when
            the target runs on CPU, else the next CUDA device.
        draft_cpus: on CPU, the cores the speculator is pinned to (the target keeps the rest);
            None lets the launcher give the speculator the last core.
        speculator_timeout: seconds the target waits for the speculator before it falls back
            to its own drafts and restarts it.
    """

    lookahead: int = 4
    mode: Mode = "async"
    tree_depth: int | None = None
    fanout_budget: int = 8
    fanout: FanoutShape = "geometric"
    beta: float = 1.0
    backup: BackupChoice = "auto"
    batch_threshold: int | None = None
    draft_device: str | None = None
    draft_cpus: tuple[int, ...] | None = None
    speculator_timeout: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.lookahead, int) or self.lookahead < 1:
            raise SSDConfigError(
                f"--speculative-num-steps (γ) must be an integer ≥ 1 for SSD, got {self.lookahead}"
            )
        if self.mode not in MODES:
            raise SSDConfigError(f"--ssd-mode must be one of {MODES}, got {self.mode!r}")
        if self.tree_depth is not None and not 1 <= self.tree_depth <= self.lookahead:
            raise SSDConfigError(
                f"--ssd-tree-depth must be in 1..γ={self.lookahead}, got {self.tree_depth}"
            )
        if self.fanout_budget < 0:
            raise SSDConfigError(f"--ssd-fanout-budget must be ≥ 0, got {self.fanout_budget}")
        if self.fanout not in FANOUT_SHAPES:
            raise SSDConfigError(
                f"--ssd-fanout must be one of {FANOUT_SHAPES}, got {self.fanout!r}"
            )
        if not 0.0 < self.beta <= 1.0:
            raise SSDConfigError(f"--ssd-beta must be in (0, 1], got {self.beta}")
        if self.backup not in BACKUPS:
            raise SSDConfigError(f"--ssd-backup must be one of {BACKUPS}, got {self.backup!r}")
        if self.batch_threshold is not None and self.batch_threshold < 1:
            raise SSDConfigError(
                f"--ssd-batch-threshold must be ≥ 1 (or 'auto'), got {self.batch_threshold}"
            )
        if self.draft_device is not None and not _DEVICE_RE.match(self.draft_device):
            raise SSDConfigError(
                f"--ssd-draft-device must be 'cpu' or 'cuda:N', got {self.draft_device!r}"
            )
        if self.draft_cpus is not None:
            if not self.draft_cpus or any(c < 0 for c in self.draft_cpus):
                raise SSDConfigError(f"--ssd-draft-cpus is invalid: {self.draft_cpus}")
            if self.draft_device is not None and self.draft_device != "cpu":
                raise SSDConfigError("--ssd-draft-cpus only applies with --ssd-draft-device cpu")
        if not self.speculator_timeout > 0:
            raise SSDConfigError(
                f"--ssd-speculator-timeout must be > 0 seconds, got {self.speculator_timeout}"
            )

    @property
    def depth(self) -> int:
        """D, the effective tree depth (γ when `tree_depth` is None)."""
        return self.lookahead if self.tree_depth is None else self.tree_depth

    def replace(self, **changes: Any) -> SSDConfig:
        """A validated copy with `changes` applied (used by the runtime admin endpoint)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        """Serialise to JSON (round-trips through `from_json`)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SSDConfig:
        """Parse `to_json` output; unknown keys raise `SSDConfigError`."""
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SSDConfigError(f"unknown SSD config keys: {sorted(unknown)}")
        if data.get("draft_cpus") is not None:
            data["draft_cpus"] = tuple(data["draft_cpus"])
        return cls(**data)

    def to_env(self, environ: dict[str, str] | None = None) -> None:
        """Store in `environ` (default `os.environ`) for SGLang's subprocesses to inherit."""
        (os.environ if environ is None else environ)[ENV_VAR] = self.to_json()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> SSDConfig | None:
        """The config the launcher stored, or None when not launched through it."""
        text = (os.environ if environ is None else environ).get(ENV_VAR)
        return None if text is None else cls.from_json(text)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, lookahead: int) -> SSDConfig:
        """Build from the namespace `add_ssd_args` filled, with γ from SGLang's flags."""
        return cls(
            lookahead=lookahead,
            mode=ns.ssd_mode,
            tree_depth=ns.ssd_tree_depth,
            fanout_budget=ns.ssd_fanout_budget,
            fanout=ns.ssd_fanout,
            beta=ns.ssd_beta,
            backup=ns.ssd_backup,
            batch_threshold=ns.ssd_batch_threshold,
            draft_device=ns.ssd_draft_device,
            draft_cpus=ns.ssd_draft_cpus,
            speculator_timeout=ns.ssd_speculator_timeout,
        )


def _threshold(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from exc


def _cpu_list(text: str) -> tuple[int, ...]:
    try:
        return parse_cpu_list(text)
    except SSDConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_ssd_args(parser: argparse.ArgumentParser) -> None:
    """Add the `--ssd-*` flags (defaults from `SSDConfig`) as one argument group."""
    d = SSDConfig()
    g = parser.add_argument_group(
        "SSD / Saguaro (sglang-ssd)",
        "Used with --speculative-algorithm SSD; γ is --speculative-num-steps.",
    )
    g.add_argument(
        "--ssd-mode",
        choices=MODES,
        default=d.mode,
        help="async: pre-speculate while the target verifies (SSD); "
        "sync: draft only when asked (synchronous SD baseline).",
    )
    g.add_argument(
        "--ssd-tree-depth",
        type=int,
        default=d.tree_depth,
        metavar="D",
        help="Tokens pre-speculated per cache branch, 1..γ (default γ).",
    )
    g.add_argument(
        "--ssd-fanout-budget",
        type=int,
        default=d.fanout_budget,
        metavar="B",
        help="Cached outcomes per request per round, Σ_k F_k.",
    )
    g.add_argument(
        "--ssd-fanout",
        choices=FANOUT_SHAPES,
        default=d.fanout,
        help="Spread of the budget over accepted lengths (Theorem 12: geometric).",
    )
    g.add_argument(
        "--ssd-beta",
        type=float,
        default=d.beta,
        help="Saguaro sampling β in (0, 1]; 1 = plain draft sampling.",
    )
    g.add_argument(
        "--ssd-backup",
        choices=BACKUPS,
        default=d.backup,
        help="Cache-miss fallback; auto switches from jit to a fast backup at b*.",
    )
    g.add_argument(
        "--ssd-batch-threshold",
        type=_threshold,
        default=None,
        metavar="{N,auto}",
        help="b*: batch size from which auto uses the fast backup (default auto).",
    )
    g.add_argument(
        "--ssd-draft-device",
        default=d.draft_device,
        metavar="{cpu,cuda:N}",
        help="Speculator device (default: cpu on CPU, next GPU on GPU).",
    )
    g.add_argument(
        "--ssd-draft-cpus",
        type=_cpu_list,
        default=None,
        metavar="LIST",
        help="CPU cores for the speculator on CPU, e.g. 1 or 2-3 (default: last core).",
    )
    g.add_argument(
        "--ssd-speculator-timeout",
        type=float,
        default=d.speculator_timeout,
        metavar="SECONDS",
        help="Wait this long for the speculator before falling back and restarting it.",
    )

"""Configurations as data: `Config`, builders for the usual servers and a JSON loader.

Later experiments add configurations here or in a JSON file (`python -m eval run --configs`),
not new harness code. Every builder spells out the flags that matter for a fair comparison
(model paths, dtype, γ, top-k, draft tokens) instead of relying on launcher defaults, so the
results JSON records them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eval.servers import Server
from sglang_ssd.config import DEFAULT_LOOKAHEAD, LIVE_FIELDS, SSDConfig
from sglang_ssd.launch_server import DEFAULT_ALGORITHM, flag_value

DTYPE = "bfloat16"
# KV pool size (tokens) for eval servers: prompts here are < 500 tokens, so 8192 covers batch 8
# at 128 new tokens while keeping two real servers within this machine's 24 GB.
MAX_TOTAL_TOKENS = 8192


_SSD_DEFAULTS = SSDConfig()


@dataclass(frozen=True)
class Config:
    """One server configuration, as data.

    Attributes:
        name: unique label (table rows, result keys, log names).
        args: arguments for `python -m sglang_ssd.launch_server` (host and port are added).
        cpus: pin every process of the server to these CPUs (None: no pinning).
        threads: `OMP_NUM_THREADS` (default: ``len(cpus)`` when pinned, else unset).
        env: further environment overrides.
        notes: free text kept in the results (e.g. why a config is not lossless).
        share: name of the server this configuration runs on; configurations with the same
            `share` (and identical args, CPUs and environment) run on one server. None: its own.
        admin: SSD run-time settings (`POST /ssd/config`) applied before each of its units.
    """

    name: str
    args: tuple[str, ...] = ()
    cpus: tuple[int, ...] | None = None
    threads: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""
    share: str | None = None
    admin: Mapping[str, Any] | None = None

    @property
    def server_name(self) -> str:
        """The server this configuration runs on (its log file is named after it)."""
        return self.share or self.name

    @property
    def algorithm(self) -> str:
        """`--speculative-algorithm`, upper case, or the launcher's default when not given."""
        value = flag_value(self.args, "--speculative-algorithm") or DEFAULT_ALGORITHM
        return value.upper()

    @property
    def lookahead(self) -> int | None:
        """γ (`--speculative-num-steps`), None for autoregressive decoding."""
        if self.algorithm == "NONE":
            return None
        steps = flag_value(self.args, "--speculative-num-steps")
        return int(steps) if steps is not None else DEFAULT_LOOKAHEAD

    @property
    def ssd_mode(self) -> str:
        """`--ssd-mode` (auto, async, sync or plain), or `SSDConfig`'s default when not given."""
        return flag_value(self.args, "--ssd-mode") or _SSD_DEFAULTS.mode

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "args": list(self.args),
            "cpus": list(self.cpus) if self.cpus is not None else None,
            "threads": self.threads,
            "env": dict(self.env),
            "notes": self.notes,
            "algorithm": self.algorithm,
            "lookahead": self.lookahead,
        }
        # Only when set, so results written before these fields existed still resume.
        if self.share is not None:
            out["share"] = self.share
        if self.admin is not None:
            out["admin"] = dict(self.admin)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Config:
        cpus = d.get("cpus")
        return cls(
            name=d["name"],
            args=tuple(d.get("args", ())),
            cpus=tuple(cpus) if cpus is not None else None,
            threads=d.get("threads"),
            env=dict(d.get("env", {})),
            notes=d.get("notes", ""),
            share=d.get("share"),
            admin=d.get("admin"),
        )

    def same_server(self, other: Config) -> bool:
        """Whether `other` starts exactly the same server (args, pinning, environment)."""
        return (self.args, self.cpus, self.threads, dict(self.env)) == (
            other.args, other.cpus, other.threads, dict(other.env)
        )  # fmt: skip

    def server(self, log_dir: Path, extra_args: Sequence[str] = (), **kw: Any) -> Server:
        return Server(
            name=self.server_name,
            args=[*self.args, *extra_args],
            cpus=self.cpus,
            threads=self.threads,
            env=self.env,
            log_path=log_dir / f"{self.server_name}.log",
            **kw,
        )


def default_model_dirs() -> tuple[Path, Path]:
    """The real target and draft folders; raises `ModelNotFoundError` (never pulls)."""
    from sglang_ssd.models import DRAFT_MODEL, TARGET_MODEL, model_path

    return model_path(TARGET_MODEL, pull=False), model_path(DRAFT_MODEL, pull=False)


def model_dirs(target: Path | str | None, draft: Path | str | None) -> tuple[Path, Path]:
    """The given target and draft folders, or the real pair's when either is not given
    (`default_model_dirs`)."""
    if target and draft:
        return Path(target), Path(draft)
    return default_model_dirs()


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
    lookahead: int = DEFAULT_LOOKAHEAD,
    topk: int = 1,
    cpus: Sequence[int] | None = None,
    threads: int | None = None,
    extra: Sequence[str] = (),
) -> Config:
    """SGLang's own draft-model speculative decoding: chain of γ draft tokens (top-k 1)."""
    return _sglang_speculative(
        "STANDALONE", target, draft, name, lookahead, topk, cpus, threads, extra
    )


def eagle3(
    target: Path | str,
    head: Path | str,
    *,
    name: str = "EAGLE3",
    lookahead: int = DEFAULT_LOOKAHEAD,
    cpus: Sequence[int] | None = None,
    threads: int | None = None,
    extra: Sequence[str] = (),
) -> Config:
    """SGLang's own EAGLE-3 speculative decoding with the EAGLE-3 head folder `head`: a chain
    of γ head drafts (top-k 1)."""
    return _sglang_speculative("EAGLE3", target, head, name, lookahead, 1, cpus, threads, extra)


def _sglang_speculative(
    algorithm: str,
    target: Path | str,
    draft: Path | str,
    name: str,
    lookahead: int,
    topk: int,
    cpus: Sequence[int] | None,
    threads: int | None,
    extra: Sequence[str],
) -> Config:
    """One of SGLang's own speculative algorithms with `draft` (a model or a head folder)."""
    args = (*_target_args(target, algorithm), *_chain_draft_args(draft, lookahead, str(topk)))
    notes = "SGLang's verify is greedy on CPU: not lossless at temperature > 0"
    return Config(name, (*args, *extra), _cpus(cpus), threads, notes=notes)


def ssd(
    target: Path | str,
    draft: Path | str,
    *,
    name: str = "SSD",
    mode: str = "async",
    lookahead: int = DEFAULT_LOOKAHEAD,
    cpus: Sequence[int] | None = None,
    draft_cpus: Sequence[int] | None = None,
    threads: int | None = None,
    extra: Sequence[str] = (),
) -> Config:
    """This package's SSD (`--ssd-mode async`), its synchronous-SD baseline (`sync`) or
    another `--ssd-mode` (`auto`, the server's default; `plain`).

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
    target: Path | str,
    draft: Path | str,
    *,
    lookahead: int = DEFAULT_LOOKAHEAD,
    pinned_cpus: Sequence[int] = (),
) -> list[Config]:
    """AR vs STANDALONE; with `pinned_cpus`, each server (target and draft) on those CPUs."""
    cpus = tuple(pinned_cpus) or None
    threads = len(cpus) if cpus else None
    return [
        autoregressive(target, cpus=cpus, threads=threads),
        standalone(target, draft, lookahead=lookahead, cpus=cpus, threads=threads),
    ]


def live_variants(base: Config, specs: Sequence[str]) -> list[Config]:
    """`base` and, per spec `NAME=JSON`, a configuration on `base`'s server whose units run
    with those live SSD settings (`POST /ssd/config` before each unit), e.g.
    'SSD-sync={"mode": "sync"}'. Same-server variants rule out the 8-16% that two
    servers of one configuration can differ by. `base`'s own units then reset those settings
    to the defaults (`SSDConfig`; `mode` to `base`'s own), so every unit runs with the settings
    its name says.

    Raises:
        ValueError: a spec without `NAME=`, settings that are not a non-empty JSON object, or
            a setting that cannot change while serving (`config.LIVE_FIELDS`).
    """
    variants = []
    for spec in specs:
        name, sep, text = spec.partition("=")
        try:
            settings = json.loads(text) if sep and name else None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{spec!r}: the settings are not JSON ({exc})") from None
        if not isinstance(settings, dict) or not settings:
            raise ValueError(f'{spec!r} is not NAME={{"setting": value, ...}}')
        unknown = sorted(set(settings) - set(LIVE_FIELDS))
        if unknown:
            raise ValueError(f"{spec!r}: {unknown} cannot change live (live: {LIVE_FIELDS})")
        variants.append(replace(base, name=name, share=base.name, admin=settings))
    if not variants:
        return [base]
    keys = {key for v in variants for key in v.admin or {}}
    reset = {key: getattr(_SSD_DEFAULTS, key) for key in sorted(keys)}
    if "mode" in reset:
        reset["mode"] = base.ssd_mode
    return [replace(base, share=base.name, admin=reset), *variants]


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

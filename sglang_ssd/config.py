"""`SSDConfig`: every `--ssd-*` flag, declared once, validated once, shared with subprocesses.

Each `SSDConfig` field carries its `Flag` declaration in its metadata (help, argparse type/
choices/metavar, the rule its values obey, and whether it can change while serving). The rest is
generated from those declarations: the launcher's parser (`add_ssd_args`),
`SSDConfig.from_namespace`, the checks in `__post_init__`, the settings `POST /ssd/config` may
change (`LIVE_FIELDS`) and the live-settings wire struct (`sglang_ssd.transport.LiveSettings`).
Adding a flag means adding one field.

SGLang has no API for a plugin to add CLI flags, so `sglang_ssd.launch_server` parses the
`--ssd-*` flags itself and hands the result to the scheduler subprocess through the
`SGLANG_SSD_CONFIG` environment variable (`to_env` / `from_env`). This module imports nothing
beyond the standard library, `saguaro.draft_kinds`, `runtime_registry` and `launch.cpu_lists`
(all standard library only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from sglang_ssd.launch.cpu_lists import CpuListError, parse_cpu_list
from sglang_ssd.runtime_registry import AUTO as AUTO_RUNTIME
from sglang_ssd.runtime_registry import HEAD_RUNTIME, INT8_RUNTIME, RUNTIMES
from sglang_ssd.runtime_registry import NAMES as RUNTIME_NAMES
from sglang_ssd.saguaro.draft_kinds import backup_names

# γ when `--speculative-num-steps` is not given: the launcher's default, every bench's and
# tool's (the EAGLE-3 trainer's evaluation, the tiny pair's check).
DEFAULT_LOOKAHEAD = 4

ENV_VAR = "SGLANG_SSD_CONFIG"
# Test-only: set to 1 in the server's environment, `--ssd-mode auto` runs the arrangements it
# offers in turn, a switch every round (the lossless-across-switches tests).
CYCLE_ENV = "SGLANG_SSD_CYCLE_ARRANGEMENTS"

Mode = Literal["auto", "async", "sync", "plain"]
FanoutShape = Literal["geometric", "uniform", "predicted"]
# The speculator's backup kinds (`saguaro.draft_kinds`), or "auto" (the policy picks per batch).
BackupChoice = Literal[(*backup_names(), "auto")]  # type: ignore[valid-type]

MODES: tuple[str, ...] = get_args(Mode)
FANOUT_SHAPES: tuple[str, ...] = get_args(FanoutShape)
BACKUPS: tuple[str, ...] = get_args(BackupChoice)
# Static ceilings on what a flag or a live change can make the speculator allocate; the live
# bound of the fan-out budget (`fanout_budget_limit`) depends on the pool and is usually far lower.
MAX_FANOUT_BUDGET = 2**16
MAX_DRAFT_KV_TOKENS = 2**26
MAX_DRAFT_VOCAB = 2**24
# `--ssd-draft-vocab` default: a smaller LM head at no cost in acceptance
# (docs/benchmarks.md#the-draft-vocabulary).
DEFAULT_DRAFT_VOCAB = 65536
# The speculator's pool when the target's capacity is unknown (a client started outside SGLang).
DEFAULT_DRAFT_KV_TOKENS = 65536
_DEVICE_RE = re.compile(r"^(cpu|cuda:\d+)$")
_METADATA_KEY = "ssd_flag"


class SSDConfigError(ValueError):
    """An `--ssd-*` value (or a combination with SGLang's flags) that SSD cannot run with."""


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
    except CpuListError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


@dataclass(frozen=True)
class Flag:
    """The declaration of one `SSDConfig` field: its flag, parser, rule and whether it is live.

    Attributes:
        help: the `--help` text: one sentence of at most 200 characters (docs/flags.md
            shows it; the longer story lives in docs/).
        ok: the rule a value obeys, as a predicate (None: the value must be one of `choices`).
            A field whose default is None may also be None; that is not checked.
        rule: the rule in words, as the error message puts it ("must be ≥ 0").
        choices, metavar, parse: argparse's choices, metavar and type (text → value).
        live: `POST /ssd/config` may change it while serving.
        option: the flag that sets it; empty means ``--ssd-`` + the field name with dashes.
            Only γ has another: it is SGLang's `--speculative-num-steps` (``cli=False``).
        cli: `add_ssd_args` adds the flag.
        switch: a boolean flag given without a value (argparse's ``store_true``).
        default: the field's default (also the flag's); filled in from the field.
        evidence: the doc section (relative to docs/, with its anchor) that measures or
            explains the flag's default; docs/flags.md links it.
    """

    help: str
    ok: Callable[[Any], bool] | None = None
    rule: str = ""
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    live: bool = False
    option: str = ""
    cli: bool = True
    switch: bool = False
    default: Any = None
    evidence: str = ""

    def problem(self, value: Any) -> str | None:
        """Why `value` is refused (naming the flag), or None when it is allowed."""
        if value is None and self.default is None:
            return None
        try:
            allowed = self.ok(value) if self.ok is not None else value in (self.choices or ())
        except TypeError:  # e.g. a string compared with a number
            allowed = False
        if allowed:
            return None
        rule = self.rule or f"must be one of {self.choices}"
        return f"{self.option} {rule}, got {value!r}"


# The declaration of a boolean flag given without a value.
SWITCH: dict[str, Any] = {
    "ok": lambda v: isinstance(v, bool),
    "rule": "must be a boolean",
    "switch": True,
}


def flag(help: str, **declaration: Any) -> dict[str, Flag]:
    """The metadata of an `SSDConfig` field declared by ``Flag(help, **declaration)``."""
    return {_METADATA_KEY: Flag(help, **declaration)}


@dataclass(frozen=True)
class SSDConfig:
    """Settings of SSD / Saguaro: one field per `--ssd-*` flag, plus γ from SGLang.

    See each field's `Flag` for its meaning; docs/design.md#the-method for the method.
    """

    lookahead: int = field(
        default=DEFAULT_LOOKAHEAD,
        metadata=flag(
            "γ, draft tokens per round (SGLang's --speculative-num-steps).",
            evidence="benchmarks.md#equal-hardware",
            ok=lambda v: isinstance(v, int) and v >= 1,
            rule="(γ) must be an integer ≥ 1 for SSD",
            option="--speculative-num-steps",
            cli=False,
        ),
    )
    mode: Mode = field(
        default="auto",
        metadata=flag(
            "Arrangement of the cores per round: async (SSD), sync (synchronous SD on all "
            "cores), plain (the target alone; CPU only) or auto (per batch size the fastest "
            "measured, by 5% or more).",
            evidence="benchmarks.md#the-core-planner-auto",
            choices=MODES,
            live=True,
        ),
    )
    tree_depth: int | None = field(
        default=None,
        metadata=flag(
            "Tokens pre-speculated per cache branch, 1..γ; unset (or 0), each round takes the "
            "depth the speedup model rates fastest from live build and verify times.",
            evidence="benchmarks.md#tree-depth",
            ok=lambda v: isinstance(v, int) and v >= 0,
            rule="must be in 0..γ (0: self-tuned)",
            metavar="D",
            parse=int,
            live=True,
        ),
    )
    fanout_budget: int = field(
        default=8,
        metadata=flag(
            "Cached outcomes per request per round, Σ_k F_k.",
            evidence="benchmarks.md#the-fan-out-budget",
            ok=lambda v: 0 <= v <= MAX_FANOUT_BUDGET,
            rule=f"must be ≥ 0 (at most {MAX_FANOUT_BUDGET})",
            metavar="B",
            parse=int,
            live=True,
        ),
    )
    fanout: FanoutShape = field(
        default="predicted",
        metadata=flag(
            "Which outcomes the budget caches: geometric over accept lengths (Theorem 12), "
            "uniform, or predicted (the most likely per request, from the draft's calibrated "
            "probabilities).",
            evidence="benchmarks.md#outcome-prediction-and-fan-out",
            choices=FANOUT_SHAPES,
            live=True,
        ),
    )
    beta: float = field(
        default=1.0,
        metadata=flag(
            "Saguaro sampling β in (0, 1] (Definition 14); 1 = plain draft sampling.",
            evidence="benchmarks.md#temperature",
            ok=lambda v: 0.0 < v <= 1.0,
            rule="must be in (0, 1]",
            parse=float,
            metavar="β",
            live=True,
        ),
    )
    backup: BackupChoice = field(
        default="auto",
        metadata=flag(
            "Cache-miss fallback; auto switches from jit to a fast backup at b* (Theorem 17).",
            evidence="benchmarks.md#cache-misses",
            choices=BACKUPS,
            live=True,
        ),
    )
    batch_threshold: int | None = field(
        default=None,
        metadata=flag(
            "b*: batch size from which auto uses the fast backup (default auto: derived from "
            "measured latencies).",
            evidence="benchmarks.md#cache-misses",
            ok=lambda v: v >= 1,
            rule="must be ≥ 1 (or 'auto')",
            metavar="{N,auto}",
            parse=_threshold,
        ),
    )
    draft_device: str | None = field(
        default=None,
        metadata=flag(
            "Speculator device (default: cpu on CPU; on GPU the first GPU after every target "
            "rank; it may not be one of the target's GPUs).",
            evidence="benchmarks.md#gpu-model",
            ok=lambda v: _DEVICE_RE.match(v) is not None,
            rule="must be 'cpu' or 'cuda:N'",
            metavar="{cpu,cuda:N}",
        ),
    )
    draft_cpus: tuple[int, ...] | None = field(
        default=None,
        metadata=flag(
            "CPU cores for the speculator on CPU, e.g. 1 or 2-3 (default: last core; the target "
            "keeps the rest).",
            evidence="benchmarks.md#machines",
            ok=lambda v: len(v) > 0 and all(c >= 0 for c in v),
            rule="must be a non-empty list of CPU ids",
            metavar="LIST",
            parse=_cpu_list,
        ),
    )
    speculator_timeout: float = field(
        default=30.0,
        metadata=flag(
            "Seconds without progress from the speculator (its CPU time not growing) before the "
            "target drafts alone and restarts it; a busy one is waited for up to 10 times this.",
            evidence="design.md#when-the-speculator-is-down",
            ok=lambda v: v > 0,
            rule="must be > 0 seconds",
            metavar="SECONDS",
            parse=float,
        ),
    )
    draft_vocab: int = field(
        default=DEFAULT_DRAFT_VOCAB,
        metadata=flag(
            "The speculator drafts among the N most frequent token ids (counted once per "
            "tokenizer, cached) plus special and EOS ids; 0 or N >= V: every id; output is "
            "unchanged.",
            evidence="benchmarks.md#the-draft-vocabulary",
            ok=lambda v: isinstance(v, int) and 0 <= v <= MAX_DRAFT_VOCAB,
            rule=f"must be an integer in 0..{MAX_DRAFT_VOCAB}",
            metavar="N",
            parse=int,
        ),
    )
    draft_kv_tokens: int | None = field(
        default=None,
        metadata=flag(
            "Speculator KV pool in tokens (default: the target's pool plus, per running request, "
            "γ + 1 + fan-out budget × γ); requests that do not fit get backup drafts.",
            evidence="design.md#the-speculation-cache",
            ok=lambda v: isinstance(v, int) and 1 <= v <= MAX_DRAFT_KV_TOKENS,
            rule=f"must be an integer in 1..{MAX_DRAFT_KV_TOKENS}",
            metavar="TOKENS",
            parse=int,
        ),
    )
    draft_runtime: str = field(
        default=AUTO_RUNTIME,
        metadata=flag(
            f"What runs the draft's forwards ({', '.join(RUNTIMES)}); {AUTO_RUNTIME} picks "
            f"{HEAD_RUNTIME} for an EAGLE-3 head folder, else {INT8_RUNTIME} on the CPU and torch "
            "on a GPU.",
            evidence="benchmarks.md#draft-runtimes",
            choices=RUNTIME_NAMES,
        ),
    )
    allow_shared_cores: bool = field(
        default=False,
        metadata=flag(
            "Tests only: with --dp-size > 1 on CPU, let DP replicas share cores when there are "
            "fewer than 2 per replica; they then slow each other down, so never measure speed "
            "with it.",
            evidence="scale-out.md#scaling-out-several-gpus-replicas-and-machines",
            **SWITCH,
        ),
    )
    verify_cuda_graph: bool = field(
        default=False,
        metadata=flag(
            "On CUDA, replay SSD's verify from SGLang's CUDA graphs; off until a GPU run checks "
            "greedy equality under replay; refused on the CPU and with an EAGLE-3 head draft.",
            evidence="cuda.md#cuda-graphs-for-the-verify---ssd-verify-cuda-graph",
            **SWITCH,
        ),
    )

    def __post_init__(self) -> None:
        for name in FLAGS:
            check_setting(name, getattr(self, name))
        if self.tree_depth is not None and self.tree_depth > self.lookahead:
            raise SSDConfigError(
                f"--ssd-tree-depth must be in 0..γ={self.lookahead} (0: self-tuned), "
                f"got {self.tree_depth}"
            )
        if self.tree_depth == 0:  # one spelling of "self-tuned": None, as by default
            object.__setattr__(self, "tree_depth", None)
        if self.draft_cpus is not None and self.draft_device not in (None, "cpu"):
            raise SSDConfigError("--ssd-draft-cpus only applies with --ssd-draft-device cpu")
        if self.draft_kv_tokens is not None and self.branch_slots > self.draft_kv_tokens:
            raise SSDConfigError(
                f"--ssd-fanout-budget × tree depth ({self.fanout_budget} × {self.depth}) must fit "
                f"in --ssd-draft-kv-tokens ({self.draft_kv_tokens})"
            )

    @property
    def depth(self) -> int:
        """D when pinned, else γ, the deepest a self-tuned build goes (`tree_depth` None)."""
        return self.tree_depth or self.lookahead

    @property
    def branch_slots(self) -> int:
        """B × D: KV slots of one request's pre-speculated branches in one round."""
        return self.fanout_budget * self.depth

    def draft_kv_slots(self, capacity: TargetCapacity | None) -> int:
        """The speculator's KV pool in tokens: `draft_kv_tokens` when given; else room for every
        token the target's pool holds (each committed token is also in the draft's KV) plus, per
        running request, its draft and root (γ + 1) and its branches (B × γ: the tree depth is
        live, so room for the deepest); else (capacity unknown) `DEFAULT_DRAFT_KV_TOKENS`. At
        most `MAX_DRAFT_KV_TOKENS`."""
        if self.draft_kv_tokens is not None:
            return self.draft_kv_tokens
        if capacity is None:
            return DEFAULT_DRAFT_KV_TOKENS
        per_request = self.lookahead + 1 + self.fanout_budget * self.lookahead
        slots = capacity.max_total_tokens + capacity.max_running_requests * per_request
        return min(slots, MAX_DRAFT_KV_TOKENS)

    def check_fanout_budget(self, budget: int, longest_request: int, vocab_size: int) -> None:
        """Refuse a live fan-out budget above what this server's speculator can hold
        (`fanout_budget_limit`, the pool being `draft_kv_tokens` as the target resolved it);
        keeping or lowering the budget is always allowed.

        Args:
            budget: the B asked for. longest_request: tokens one request can commit.
            vocab_size: V of the target's logits.

        Raises:
            SSDConfigError: naming --ssd-fanout-budget, the limit and the bound that sets it.
        """
        if budget <= self.fanout_budget:
            return
        limit, why = fanout_budget_limit(
            self.draft_kv_slots(None), longest_request, self.lookahead, self.lookahead, vocab_size
        )
        if budget > limit:
            raise SSDConfigError(
                f"--ssd-fanout-budget must be at most {max(limit, self.fanout_budget)} on this "
                f"server ({why}), got {budget}"
            )

    def replace(self, **changes: Any) -> SSDConfig:
        """A validated copy with `changes` applied (used by the runtime admin endpoint)."""
        return dataclasses.replace(self, **changes)

    def flags_line(self) -> str:
        """Every setting by its flag, as the startup log shows the settings in force (a live
        one marked `*`; None printed as "auto", as docs/flags.md names it: self-tuned,
        chosen, sized or placed by the server), e.g. "--speculative-num-steps 4, --ssd-mode
        async, --ssd-tree-depth* auto, ..."."""
        parts = []
        for name, flag in FLAGS.items():
            value = getattr(self, name)
            if value is None:
                shown = "auto"
            elif isinstance(value, tuple):
                shown = ",".join(map(str, value))
            else:
                shown = str(value)
            parts.append(f"{flag.option}{'*' if flag.live else ''} {shown}")
        return ", ".join(parts)

    def to_json(self) -> str:
        """Serialise to JSON (round-trips through `from_json`)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SSDConfig:
        """Parse `to_json` output; unknown keys raise `SSDConfigError`."""
        data = json.loads(text)
        unknown = set(data) - set(FLAGS)
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
        values = {name: getattr(ns, _dest(name)) for name, flag in FLAGS.items() if flag.cli}
        return cls(lookahead=lookahead, **values)


@dataclass(frozen=True)
class TargetCapacity:
    """What the target serves at once, which sizes the speculator's KV pool.

    Attributes:
        max_total_tokens: tokens the target's KV pool holds (SGLang's max_total_num_tokens).
        max_running_requests: requests the target decodes at once.
        context_len: the longest request, prompt plus output, in tokens.
    """

    max_total_tokens: int
    max_running_requests: int
    context_len: int

    @property
    def longest_request(self) -> int:
        """Tokens one request can commit: its context, bounded by the target's pool."""
        return min(self.context_len, self.max_total_tokens)


def fanout_budget_limit(
    pool_slots: int, longest_request: int, lookahead: int, depth: int, vocab_size: int
) -> tuple[int, str]:
    """The largest fan-out budget B the speculator can hold while serving, and why.

    Two bounds: one round has (γ + 1)(V − 1) outcomes (k = 0..γ accepted, any bonus but the
    draft's own token), so a larger B cannot be spent; and the branches of one request of the
    longest length, B × D slots, must fit in the pool beside its committed tokens and its draft
    and root (γ + 1 slots), else no request could ever be pre-speculated.

    Args:
        pool_slots: the speculator's KV pool in tokens.
        longest_request: tokens one request can commit (`TargetCapacity.longest_request`).
        lookahead: γ. depth: D, the tree depth. vocab_size: V of the draft's logits.

    Returns:
        (the limit, ≥ 0; the bound that sets it, in words).
    """
    outcomes = (lookahead + 1) * max(vocab_size - 1, 0)
    room = max(pool_slots - longest_request - lookahead - 1, 0) // max(depth, 1)
    if outcomes <= room:
        return outcomes, f"one round has (γ + 1)(V − 1) = {outcomes} outcomes"
    return room, (
        f"the speculator's KV pool ({pool_slots} tokens) holds a {longest_request}-token "
        f"request, its draft and {room} branches of depth {depth}"
    )


def _declared() -> dict[str, Flag]:
    out = {}
    for f in dataclasses.fields(SSDConfig):
        declared: Flag = f.metadata[_METADATA_KEY]
        option = declared.option or _option(f.name)
        out[f.name] = dataclasses.replace(declared, option=option, default=f.default)
    return out


def _option(name: str) -> str:
    return "--ssd-" + name.replace("_", "-")


def _dest(name: str) -> str:
    return "ssd_" + name


FLAGS: dict[str, Flag] = _declared()  # field name → its declaration, in field order
LIVE_FIELDS: tuple[str, ...] = tuple(name for name, flag in FLAGS.items() if flag.live)


def check_setting(name: str, value: Any) -> None:
    """Check one value against its field's rule (without the cross-field rules).

    Raises:
        SSDConfigError: an unknown field, or a value its rule refuses (the message names the flag).
    """
    if name not in FLAGS:
        raise SSDConfigError(f"unknown SSD setting {name!r}")
    problem = FLAGS[name].problem(value)
    if problem is not None:
        raise SSDConfigError(problem)


def add_ssd_args(parser: argparse.ArgumentParser) -> None:
    """Add the `--ssd-*` flags (defaults from `SSDConfig`) as one argument group."""
    group = parser.add_argument_group(
        "SSD / Saguaro (sglang-ssd)",
        "Used with --speculative-algorithm SSD; γ is --speculative-num-steps.",
    )
    for name, flag in FLAGS.items():
        if not flag.cli:
            continue
        shown = re.sub(r"%(?!\()", "%%", flag.help)  # argparse %-formats every help text
        if not flag.switch and flag.default is not None and "%(default)" not in shown:
            shown += " (default: %(default)s)"
        options: dict[str, Any] = {"dest": _dest(name), "default": flag.default, "help": shown}
        if flag.switch:
            group.add_argument(flag.option, action="store_true", **options)
            continue
        if flag.parse is not None:
            options["type"] = flag.parse
        if flag.choices is not None:
            options["choices"] = flag.choices
        if flag.metavar is not None:
            options["metavar"] = flag.metavar
        group.add_argument(flag.option, **options)

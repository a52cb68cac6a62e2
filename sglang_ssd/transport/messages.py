"""Control messages between the target-side SSD worker and the speculator process (the link).

Every message is a frozen msgspec Struct tagged by its ``type`` field and travels as one msgpack
frame over ZMQ (`control.py`); tensors never do (`tensor_link.py`). The decoder is the only way
bytes become messages and is safe on untrusted input (`wire.Codec`): anything malformed, unknown
or out of range raises `msgspec.ValidationError` / `msgspec.DecodeError`, never anything else,
and never unpickles. What this family shares with the admin bridge's (`admin_messages`: the
HTTP process asking the scheduler for `/ssd/config` and `/ssd/stats`, through its own codec, so
neither family can be sent on the other's socket) lives in `wire`: bounds, errors, struct bases,
the codec and `LiveSettings`.

Bump `PROTOCOL_VERSION` on any change to these types or the admin ones (`schema_digest`
fingerprints both families, and a test holds each version's fingerprint); `Hello`/`HelloAck`
must stay decodable across versions so a mismatch is reported clearly instead of timing out.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import itertools
import json
import sys
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from sglang_ssd.config import FLAGS, LIVE_FIELDS
from sglang_ssd.saguaro.draft_kinds import CACHE, backup_names, fast_backup_names
from sglang_ssd.transport import admin_messages, wire
from sglang_ssd.transport.wire import (
    MAX_BATCH,
    MAX_DEPTH,
    MAX_ID,
    MAX_TENSOR_BYTES,
    MAX_VOCAB,
    Codec,
    Id,
    LiveSettings,
    Rid,
    Seconds,
    Struct,
    Text,
    TokenId,
    finite,
    unique,
)
from sglang_ssd.transport.wire import Message as _Message

# Bumped whenever a message's schema changes; tests/transport/test_protocol_version.py pins
# each version's schema digest, and git history says what changed.
PROTOCOL_VERSION = 14

Role = Literal["target", "speculator"]
StepBackup = Literal[backup_names()]  # type: ignore[valid-type]  # `saguaro.draft_kinds`
QDtype = Literal["float32", "bfloat16", "float16"]
PhaseName = Annotated[str, Meta(min_length=1, max_length=32, pattern=r"^[a-z0-9_]+$")]
MAX_PHASES = MAX_DEPTH + 64  # a tree_d phase per depth, and the others


# Where the speculator got a request's draft: its speculation cache (CACHE), one of the
# backups (the one the target chose for misses: a member per speculator kind of
# `saguaro.draft_kinds.KINDS`), or nowhere (MISSING, an unknown request: the target drafts it with
# its own n-gram).
DraftSource = enum.StrEnum(  # type: ignore[misc]
    "DraftSource",
    {name.upper(): name for name in (CACHE, *backup_names(), "missing")},
)
DraftSource.__doc__ = "Where the speculator got a request's draft (see `saguaro.draft_kinds`)."


# Handshake. Unknown fields are allowed here (only here) so that a peer speaking another
# protocol version still decodes these two and gets a clear "version mismatch".
class Hello(_Message, tag="hello", forbid_unknown_fields=False):
    """Speculator → target, first message: who is connecting.

    version: the speculator's `PROTOCOL_VERSION`; role: always "speculator" today; pid: its
    process id; session: the token from the `LinkAddress` it was started with; q_columns: the
    ids of the draft vocabulary in force, ascending and distinct (None: every id), the only
    columns where a q row can be non-zero, so `Drafts` with `q_columns` send q at that width
    (65,558 of 151,936 ids for the 0.5B draft's default vocabulary).
    """

    version: Annotated[int, Meta(ge=0)]
    role: Role
    pid: Annotated[int, Meta(ge=0)]
    session: Rid
    q_columns: Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_VOCAB)] | None = None

    def __post_init__(self) -> None:
        cols = self.q_columns
        if cols is not None and any(b <= a for a, b in itertools.pairwise(cols)):
            raise ValueError("Hello.q_columns must be ascending and distinct")


class HelloAck(_Message, tag="hello_ack", forbid_unknown_fields=False):
    """Target → speculator: the handshake verdict; ``reason`` says why when not accepted."""

    version: Annotated[int, Meta(ge=0)]
    accepted: bool
    reason: Text = ""


class SamplingSpec(Struct):
    """A request's sampling options as SGLang stores them.

    temperature ≥ 0 (0 = greedy); top_k = -1 (off) or ≥ 1, as in SGLang; top_p in (0, 1];
    seed: the request's sampling seed or None.
    """

    temperature: Annotated[float, Meta(ge=0.0)]
    top_k: Annotated[int, Meta(ge=-1, le=MAX_VOCAB)]
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)]
    seed: int | None = None

    def __post_init__(self) -> None:
        finite("temperature", self.temperature)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or at least 1")


class Open(_Message, tag="open"):
    """Target → speculator: request ``rid`` with these tokens (prompt + output so far).

    ``prespeculate``: sent at prefill, before the target samples the first token; the speculator
    may pre-speculate the first round for the likeliest first tokens (outcome k = 0).
    """

    rid: Rid
    token_ids: list[TokenId]
    sampling: SamplingSpec
    prespeculate: bool = False


class Close(_Message, tag="close"):
    """Target → speculator: forget request ``rid`` (finished, aborted or left the batch)."""

    rid: Rid


class Outcome(Struct):
    """Verify result of one request's last speculative round: k accepted draft tokens + the
    bonus, then `extra`: the tokens the target committed in plain rounds since (no draft)."""

    rid: Rid
    accept_len: Annotated[int, Meta(ge=0, le=MAX_DEPTH)]
    bonus: TokenId
    extra: list[TokenId] = msgspec.field(default_factory=list)


FeatureDtype = Literal["bfloat16", "float16", "float32"]


class FeatureSpan(Struct):
    """The target's EAGLE-3 features of one request's committed positions start .. start +
    count − 1 (the prompt after its prefill, the k + 1 committed positions of each round)."""

    rid: Rid
    start: Annotated[int, Meta(ge=0, le=MAX_ID)]
    count: Annotated[int, Meta(ge=1, le=MAX_BATCH)]


class Step(_Message, tag="step"):
    """Target → speculator, once per decode round.

    step_id: strictly increasing per link. outcomes: the last round's results; requests: rids (in
    batch order) that need a draft now; backup: the fallback the target chose for misses;
    tree_depth: D for the pre-speculation after this Step (`DepthTuner`), 0 = the speculator's
    configured depth. prespeculate: False for a round drafted just in time (a sync round, or
    `--ssd-mode sync`): no pre-speculation follows this Step. draft_cpus: the cores this
    Step's drafts run on (a sync round: every core both processes hold), empty for the
    speculator's own. features: spans of target features for an EAGLE-3 head draft; their
    tensor, `feature_dtype` [Σ count, feature_size] in span order, follows on the tensor link
    (`link.feature_spec`). Every Step is answered by exactly one `Drafts` with the same step_id.
    """

    step_id: Id
    outcomes: Annotated[list[Outcome], Meta(max_length=MAX_BATCH)]
    requests: Annotated[list[Rid], Meta(max_length=MAX_BATCH)]
    backup: StepBackup
    tree_depth: Annotated[int, Meta(ge=0, le=MAX_DEPTH)] = 0
    prespeculate: bool = True
    draft_cpus: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=4096)] = msgspec.field(
        default_factory=list
    )
    features: Annotated[list[FeatureSpan], Meta(max_length=MAX_BATCH)] = msgspec.field(
        default_factory=list
    )
    feature_size: Annotated[int, Meta(ge=0, le=MAX_VOCAB)] = 0
    feature_dtype: FeatureDtype = "bfloat16"

    def __post_init__(self) -> None:
        unique("Step.outcomes", [o.rid for o in self.outcomes])
        unique("Step.requests", self.requests)
        if len(set(self.draft_cpus)) != len(self.draft_cpus):
            raise ValueError("Step.draft_cpus names a core more than once")
        if self.features and self.feature_size < 1:
            raise ValueError("Step.features needs feature_size >= 1")
        if self.feature_rows() * self.feature_size * 4 > MAX_TENSOR_BYTES:
            raise ValueError(f"Step features exceed {MAX_TENSOR_BYTES} bytes")

    def feature_rows(self) -> int:
        """Rows of the features tensor that follows this Step: the spans' counts summed."""
        return sum(span.count for span in self.features)


_POINT_MASS_SOURCES = (*map(DraftSource, fast_backup_names()), DraftSource.MISSING)


class DraftEntry(Struct):
    """One request's draft in a `Drafts` reply.

    depth: draft tokens in this row (≤ Drafts.max_depth; the rest of the row is -1);
    has_q: the row's exact q travels in the q tensor. Point-mass drafts (ngram, random) and
    missing rows carry no q; a missing row has depth 0.
    """

    rid: Rid
    source: DraftSource
    depth: Annotated[int, Meta(ge=0, le=MAX_DEPTH)]
    has_q: bool

    def __post_init__(self) -> None:
        if self.has_q and self.source in _POINT_MASS_SOURCES:
            raise ValueError(f"a {self.source} draft has no q")
        if self.source == DraftSource.MISSING and self.depth != 0:
            raise ValueError("a missing draft has depth 0")


class SpeculatorTiming(Struct):
    """Where the speculator's time went, in seconds: `build_s` of its latest pre-speculation,
    `lookup_s` and `backup_s` of this Step, and `phases` (`sglang_ssd.phases`: glue, tree_d,
    lm_head, sampling, populate, lookup, pack, send, ...) summed since the previous Drafts, in
    which it ran `forwards` draft forwards, `build_forwards` of them pre-speculation's."""

    build_s: Seconds = 0.0
    lookup_s: Seconds = 0.0
    backup_s: Seconds = 0.0
    forwards: Annotated[int, Meta(ge=0)] = 0
    build_forwards: Annotated[int, Meta(ge=0)] = 0
    phases: Annotated[dict[PhaseName, Seconds], Meta(max_length=MAX_PHASES)] = msgspec.field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        for name in ("build_s", "lookup_s", "backup_s"):
            finite(name, getattr(self, name))
        for name, value in self.phases.items():
            finite(f"phases[{name}]", value)


class Drafts(_Message, tag="drafts"):
    """Speculator → target: the drafts for Step ``step_id``, one entry per requested rid, in order.

    The tensors follow on the tensor link: tokens int64 [len(entries), max_depth] (-1 padded)
    and, when any entry has_q, q of `q_dtype` [n_q, max_depth, q_width] for those rows in
    entry order. q_columns: 0 when q holds every id (q_width = vocab_size), else the number
    of columns sent, which are the ids of the speculator's `Hello.q_columns` in that order.
    """

    step_id: Id
    entries: Annotated[list[DraftEntry], Meta(max_length=MAX_BATCH)]
    max_depth: Annotated[int, Meta(ge=0, le=MAX_DEPTH)]
    vocab_size: Annotated[int, Meta(ge=1, le=MAX_VOCAB)]
    q_dtype: QDtype = "float32"
    timing: SpeculatorTiming = msgspec.field(default_factory=SpeculatorTiming)
    q_columns: Annotated[int, Meta(ge=0, le=MAX_VOCAB)] = 0

    def __post_init__(self) -> None:
        unique("Drafts.entries", [e.rid for e in self.entries])
        for entry in self.entries:
            if entry.depth > self.max_depth:
                raise ValueError(f"entry {entry.rid}: depth {entry.depth} > {self.max_depth}")
        if self.q_columns > self.vocab_size:
            raise ValueError(f"q_columns {self.q_columns} > vocab_size {self.vocab_size}")
        if self.tensor_bytes() > MAX_TENSOR_BYTES:
            raise ValueError(f"Drafts tensors exceed {MAX_TENSOR_BYTES} bytes")

    @property
    def n_q(self) -> int:
        """Rows that carry q."""
        return sum(entry.has_q for entry in self.entries)

    @property
    def q_width(self) -> int:
        """Columns of the q tensor: `q_columns`, or `vocab_size` when that is 0."""
        return self.q_columns or self.vocab_size

    def tensor_bytes(self) -> int:
        """Bytes of tokens + q this message announces."""
        q_item = 4 if self.q_dtype == "float32" else 2
        q_bytes = self.n_q * self.max_depth * self.q_width * q_item
        return len(self.entries) * self.max_depth * 8 + q_bytes


class Configure(_Message, tag="configure"):
    """Target → speculator: change the `changes` given, between rounds."""

    changes: LiveSettings = msgspec.field(default_factory=LiveSettings)


class ConfigureAck(_Message, tag="configure_ack"):
    """Speculator → target: every live setting in force after applying a `Configure`."""

    applied: LiveSettings

    def __post_init__(self) -> None:
        # A setting whose default is None (tree depth: self-tuned) may be None in force too.
        required = {name for name in LIVE_FIELDS if FLAGS[name].default is not None}
        missing = sorted(required - set(self.applied.given()))
        if missing:
            raise ValueError(f"ConfigureAck.applied lacks {missing}")


class StatsRequest(_Message, tag="stats"):
    """Target → speculator: ask for its counters."""


Count = Annotated[int, Meta(ge=0)]
# Counts by a small int (a fan-out F, a tree depth D): open-ended, so a dict, not fields.
CountsBy = Annotated[
    dict[Annotated[int, Meta(ge=0, le=MAX_VOCAB)], Count], Meta(max_length=MAX_BATCH)
]


class SpeculatorStats(Struct):
    """The speculator's counters for `/ssd/stats`, totals since it started unless said.

    Its Steps (`SpeculatorServer`): `steps` answered (Drafts sent) and the seconds of each part
    of them, `build_s` (pre-speculation after the Step), `lookup_s` (outcomes and features in),
    `backup_s` (serving the drafts), `send_s` (sending them).

    Its engine (`SpeculatorEngine`), now: the speculation cache's `cache_hits`,
    `cache_misses`, `cache_evicted_requests`, `cache_truncated_entries` (totals) and
    `cache_entries`; KV slots in use and in all (`kv_slots_used`, `kv_slots_total`); requests
    open and still prefilling; the live hit-model exponent r (`hit_exponent`); the ids the
    draft samples from (`draft_vocab_size`, `--ssd-draft-vocab`); the D of the latest build
    (`build_tree_depth`). Totals: rounds the KV pool degraded (`kv_exhausted` =
    `kv_exhausted_drafts` + `kv_exhausted_builds`), drafts served by a backup while the
    request's prefill went on (`prefill_backup_drafts`), and for the speedup model
    (`eval.model_check`) the outcomes that had F cached branches at their accept length
    (`fanout_outcomes`, by F), those that hit (`fanout_hits`, by F) and the builds by tree
    depth (`builds_at_depth`, by D).
    """

    steps: Count = 0
    build_s: Seconds = 0.0
    lookup_s: Seconds = 0.0
    backup_s: Seconds = 0.0
    send_s: Seconds = 0.0
    cache_hits: Count = 0
    cache_misses: Count = 0
    cache_evicted_requests: Count = 0
    cache_truncated_entries: Count = 0
    kv_slots_used: Count = 0
    kv_slots_total: Count = 0
    open_requests: Count = 0
    prefilling_requests: Count = 0
    cache_entries: Count = 0
    hit_exponent: float = 0.0
    kv_exhausted: Count = 0
    kv_exhausted_drafts: Count = 0
    kv_exhausted_builds: Count = 0
    prefill_backup_drafts: Count = 0
    draft_vocab_size: Count = 0
    build_tree_depth: Count = 0
    fanout_outcomes: CountsBy = msgspec.field(default_factory=dict)
    fanout_hits: CountsBy = msgspec.field(default_factory=dict)
    builds_at_depth: CountsBy = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("build_s", "lookup_s", "backup_s", "send_s", "hit_exponent"):
            finite(name, getattr(self, name))
        if self.kv_exhausted != self.kv_exhausted_drafts + self.kv_exhausted_builds:
            raise ValueError("kv_exhausted must be kv_exhausted_drafts + kv_exhausted_builds")


class StatsReply(_Message, tag="stats_reply"):
    """Speculator → target: its counters."""

    stats: SpeculatorStats


class Shutdown(_Message, tag="shutdown"):
    """Target → speculator: close the link and exit."""


class Error(_Message, tag="error"):
    """Either direction: a request could not be served; ``reason`` says why."""

    reason: Text


Message = (
    Hello
    | HelloAck
    | Open
    | Close
    | Step
    | Drafts
    | Configure
    | ConfigureAck
    | StatsRequest
    | StatsReply
    | Shutdown
    | Error
)


_LINK = Codec(Message, "a control")
MESSAGE_TYPES: tuple[type, ...] = _LINK.types


def decode(frame: bytes) -> Message:
    """Decode one frame of the SSD link.

    Raises:
        msgspec.DecodeError: not msgpack, or (`msgspec.ValidationError`, a subclass) not a valid
            message: unknown tag or field, wrong type, out-of-range value, broken cross-field rule.
    """
    return _LINK.decode(frame)


def encode(msg: Message) -> bytes:
    """Encode one message of the SSD link, checked by decoding it back.

    Raises:
        TypeError: ``msg`` is not a link message.
        ValueError: a field breaks its constraint (e.g. a negative id set at construction).
    """
    return _LINK.encode(msg)


def schema_digest() -> str:
    """SHA-256 (hex) of the JSON schema of every message and struct of the transport (this
    module, `admin_messages` and `wire`: public names, sorted, the struct bases left out;
    descriptions and titles left out too, so docstrings may change freely): it changes whenever
    a field, a type, a constraint, a default or a tag does, i.e. whenever `PROTOCOL_VERSION`
    must (tests/transport/test_protocol_version.py)."""
    bases = (wire.Struct, wire.Message)
    types = sorted(
        (
            value
            for module in (wire, admin_messages, sys.modules[__name__])
            for name, value in vars(module).items()
            if inspect.isclass(value)
            and issubclass(value, msgspec.Struct)
            and value.__module__ == module.__name__
            and value not in bases
            and not name.startswith("_")
        ),
        key=lambda value: value.__name__,
    )
    schemas, components = msgspec.json.schema_components(types)
    text = json.dumps(
        _without_prose({"schemas": schemas, "components": components}), sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _without_prose(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_prose(v) for k, v in node.items() if k not in ("description", "title")}
    if isinstance(node, list):
        return [_without_prose(v) for v in node]
    return node

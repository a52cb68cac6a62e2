"""Control messages between the target-side SSD worker and the speculator process.

Every message is a frozen msgspec Struct tagged by its ``type`` field and travels as one msgpack
frame over ZMQ (`control.py`); tensors never do (`tensor_link.py`). The decoder is the only way
bytes become messages and is safe on untrusted input: anything malformed, unknown or out of range
raises `msgspec.ValidationError` / `msgspec.DecodeError`, never anything else, and never
unpickles. Field ranges are msgspec `Meta` constraints (checked on decode); cross-field rules live
in ``__post_init__`` (checked on construction *and* decode). `encode` re-decodes what it produced,
so a sender cannot put a frame on the wire that the peer would reject.

Bump `PROTOCOL_VERSION` on any change to these types (`schema_digest` fingerprints them, and a
test holds each version's fingerprint); `Hello`/`HelloAck` must stay decodable across versions so
a mismatch is reported clearly instead of timing out.

The admin bridge (the HTTP process asking the scheduler for `/ssd/config` and `/ssd/stats`,
`sglang_ssd.integration.admin`) speaks `AdminRequest`/`AdminReply` through its own codec
(`encode_admin`/`decode_admin`), so neither family can be sent on the other's socket. The live
settings both carry, `LiveSettings`, are generated from `SSDConfig`'s declarations.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import math
import typing
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from sglang_ssd.config import FLAGS, LIVE_FIELDS, SSDConfig, check_setting

# 2: Configure/ConfigureAck carry LiveSettings; dropped DraftEntry.round_id and
# SpeculatorTiming.idle_s (nobody read them). 3: dropped Outcome.round_id (always 0) and
# Close.reason (never read). 4: SpeculatorTiming.phases (seconds by phase, issue 12).
# 5: Step.tree_depth (the target's self-tuned D for the builds after this Step) and
# SpeculatorTiming.forwards / build_forwards. 6: Outcome.extra (tokens of plain rounds).
# 7: Step.features / feature_size / feature_dtype (an EAGLE-3 head's target features).
PROTOCOL_VERSION = 7

MAX_ID = 2**63 - 1
MAX_TOKEN_ID = 2**31 - 1
MAX_DEPTH = 1024  # draft tokens per row; far above any lookahead γ in use
MAX_VOCAB = 2**24
MAX_BATCH = 65536  # requests per Step / entries per Drafts
MAX_TENSOR_BYTES = 2**32  # tokens + q per Drafts; bounds what a receiver allocates

Id = Annotated[int, Meta(ge=0, le=MAX_ID)]
TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
Rid = Annotated[str, Meta(min_length=1, max_length=256)]
Text = Annotated[str, Meta(max_length=4096)]
Seconds = Annotated[float, Meta(ge=0.0)]
Role = Literal["target", "speculator"]
StepBackup = Literal["jit", "ngram", "random"]
QDtype = Literal["float32", "bfloat16", "float16"]
PhaseName = Annotated[str, Meta(min_length=1, max_length=32, pattern=r"^[a-z0-9_]+$")]
MAX_PHASES = MAX_DEPTH + 64  # a tree_d phase per depth, and the others


AdminOp = Literal["config", "configure", "stats"]


class DraftSource(enum.StrEnum):
    """Where the speculator got a request's draft: its speculation cache, one of the backups
    (the one the target chose for misses), or nowhere (an unknown request: the target drafts it
    with its own n-gram)."""

    CACHE = "cache"
    JIT = "jit"
    NGRAM = "ngram"
    RANDOM = "random"
    MISSING = "missing"


class TransportError(RuntimeError):
    """The SSD link failed: handshake rejected, peer gone, tensor transfer failed."""


class TransportTimeout(TransportError, TimeoutError):
    """A wait on the SSD link ran past its timeout."""


class RemoteError(TransportError):
    """The peer answered with an `Error` message; ``reason`` is its text."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"peer reported an error: {reason}")
        self.reason = reason


class _Struct(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Payload pieces nested inside messages (untagged)."""


class _Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    """Base of every top-level message; the ``type`` tag selects the class on decode."""


def _unique(what: str, rids: list[str]) -> None:
    if len(set(rids)) != len(rids):
        raise ValueError(f"{what} names a request more than once")


def _finite(what: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value}")


# Handshake. Unknown fields are allowed here (only here) so that a peer speaking another
# protocol version still decodes these two and gets a clear "version mismatch".
class Hello(_Message, tag="hello", forbid_unknown_fields=False):
    """Speculator → target, first message: who is connecting.

    version: the speculator's `PROTOCOL_VERSION`; role: always "speculator" today; pid: its
    process id; session: the token from the `LinkAddress` it was started with.
    """

    version: Annotated[int, Meta(ge=0)]
    role: Role
    pid: Annotated[int, Meta(ge=0)]
    session: Rid


class HelloAck(_Message, tag="hello_ack", forbid_unknown_fields=False):
    """Target → speculator: the handshake verdict; ``reason`` says why when not accepted."""

    version: Annotated[int, Meta(ge=0)]
    accepted: bool
    reason: Text = ""


class SamplingSpec(_Struct):
    """A request's sampling options as SGLang stores them.

    temperature ≥ 0 (0 = greedy); top_k = -1 (off) or ≥ 1, as in SGLang; top_p in (0, 1];
    seed: the request's sampling seed or None.
    """

    temperature: Annotated[float, Meta(ge=0.0)]
    top_k: Annotated[int, Meta(ge=-1, le=MAX_VOCAB)]
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)]
    seed: int | None = None

    def __post_init__(self) -> None:
        _finite("temperature", self.temperature)
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


class Outcome(_Struct):
    """Verify result of one request's last speculative round: k accepted draft tokens + the
    bonus, then `extra`: the tokens the target committed in plain rounds since (no draft)."""

    rid: Rid
    accept_len: Annotated[int, Meta(ge=0, le=MAX_DEPTH)]
    bonus: TokenId
    extra: list[TokenId] = msgspec.field(default_factory=list)


FeatureDtype = Literal["bfloat16", "float16", "float32"]


class FeatureSpan(_Struct):
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
    configured depth. features: spans of target features for an EAGLE-3 head draft; their
    tensor, `feature_dtype` [Σ count, feature_size] in span order, follows on the tensor link
    (`link.feature_spec`). Every Step is answered by exactly one `Drafts` with the same step_id.
    """

    step_id: Id
    outcomes: Annotated[list[Outcome], Meta(max_length=MAX_BATCH)]
    requests: Annotated[list[Rid], Meta(max_length=MAX_BATCH)]
    backup: StepBackup
    tree_depth: Annotated[int, Meta(ge=0, le=MAX_DEPTH)] = 0
    features: Annotated[list[FeatureSpan], Meta(max_length=MAX_BATCH)] = msgspec.field(
        default_factory=list
    )
    feature_size: Annotated[int, Meta(ge=0, le=MAX_VOCAB)] = 0
    feature_dtype: FeatureDtype = "bfloat16"

    def __post_init__(self) -> None:
        _unique("Step.outcomes", [o.rid for o in self.outcomes])
        _unique("Step.requests", self.requests)
        if self.features and self.feature_size < 1:
            raise ValueError("Step.features needs feature_size >= 1")
        if self.feature_rows() * self.feature_size * 4 > MAX_TENSOR_BYTES:
            raise ValueError(f"Step features exceed {MAX_TENSOR_BYTES} bytes")

    def feature_rows(self) -> int:
        """Rows of the features tensor that follows this Step: the spans' counts summed."""
        return sum(span.count for span in self.features)


_POINT_MASS_SOURCES = (DraftSource.NGRAM, DraftSource.RANDOM, DraftSource.MISSING)


class DraftEntry(_Struct):
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


class SpeculatorTiming(_Struct):
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
            _finite(name, getattr(self, name))
        for name, value in self.phases.items():
            _finite(f"phases[{name}]", value)


class Drafts(_Message, tag="drafts"):
    """Speculator → target: the drafts for Step ``step_id``, one entry per requested rid, in order.

    The tensors follow on the tensor link: tokens int64 [len(entries), max_depth] (-1 padded)
    and, when any entry has_q, q of `q_dtype` [n_q, max_depth, vocab_size] for those rows in
    entry order.
    """

    step_id: Id
    entries: Annotated[list[DraftEntry], Meta(max_length=MAX_BATCH)]
    max_depth: Annotated[int, Meta(ge=0, le=MAX_DEPTH)]
    vocab_size: Annotated[int, Meta(ge=1, le=MAX_VOCAB)]
    q_dtype: QDtype = "float32"
    timing: SpeculatorTiming = msgspec.field(default_factory=SpeculatorTiming)

    def __post_init__(self) -> None:
        _unique("Drafts.entries", [e.rid for e in self.entries])
        for entry in self.entries:
            if entry.depth > self.max_depth:
                raise ValueError(f"entry {entry.rid}: depth {entry.depth} > {self.max_depth}")
        if self.tensor_bytes() > MAX_TENSOR_BYTES:
            raise ValueError(f"Drafts tensors exceed {MAX_TENSOR_BYTES} bytes")

    @property
    def n_q(self) -> int:
        """Rows that carry q."""
        return sum(entry.has_q for entry in self.entries)

    def tensor_bytes(self) -> int:
        """Bytes of tokens + q this message announces."""
        q_item = 4 if self.q_dtype == "float32" else 2
        q_bytes = self.n_q * self.max_depth * self.vocab_size * q_item
        return len(self.entries) * self.max_depth * 8 + q_bytes


class _LiveSettingsBase(_Struct, omit_defaults=True):
    def __post_init__(self) -> None:
        for name, value in self.given().items():
            check_setting(name, value)

    def given(self) -> dict[str, Any]:
        """The settings this carries (its fields that are not None), by field name."""
        fields = ((name, getattr(self, name)) for name in self.__struct_fields__)
        return {name: value for name, value in fields if value is not None}

    @classmethod
    def of(cls, config: SSDConfig) -> Any:
        """Every live setting of `config`."""
        return cls(**{name: getattr(config, name) for name in LIVE_FIELDS})


def _optional_live_fields() -> list[tuple[str, Any, None]]:
    hints = typing.get_type_hints(SSDConfig)
    return [(name, hints[name] | None, None) for name in LIVE_FIELDS]


# Generated, so that declaring a field `live` in `SSDConfig` is all it takes to make it settable.
LiveSettings = msgspec.defstruct(
    "LiveSettings",
    _optional_live_fields(),
    bases=(_LiveSettingsBase,),
    module=__name__,
    namespace={
        "__doc__": "The settings that can change while serving (`config.LIVE_FIELDS`: tree depth, "
        "β, fan-out budget and shape, backup), each optional (None: not given / unchanged), each "
        "checked by its `SSDConfig` declaration on construction and decode.",
    },
)


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


class StatsReply(_Message, tag="stats_reply"):
    """Speculator → target: named counters (hits, misses, seconds, ...)."""

    counters: dict[Annotated[str, Meta(max_length=256)], float]


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


# ------------------------------------------------------------------ admin bridge
class AdminRequest(_Message, tag="admin_request"):
    """HTTP process → scheduler: read the settings (``config``), change live ones
    (``configure``, with the `changes`), or read the counters (``stats``)."""

    op: AdminOp
    changes: LiveSettings | None = None

    def __post_init__(self) -> None:
        if (self.op == "configure") != (self.changes is not None):
            raise ValueError("changes go with op 'configure', and only with it")
        if self.changes is not None and not self.changes.given():
            raise ValueError(f"no settings to change; settable: {', '.join(LIVE_FIELDS)}")


class AdminReply(_Message, tag="admin_reply"):
    """Scheduler → HTTP process: one `AdminRequest`'s answer, as an HTTP status and the parts of
    the body its op returns.

    status/error: HTTP status, and why when not 200. config (ops config, configure): the
    settings in force, `tree_depth` resolved to D. acknowledged (configure): the live settings
    the speculator applied, or, with `applied_locally`, the changes the target applied without
    one (none running, or it did not answer). stats (stats): `/ssd/stats`'s counters, free-form
    (the round timer's and the speculator's counters, the miss policy's state).
    """

    status: Annotated[int, Meta(ge=100, le=599)] = 200
    error: Text = ""
    config: SSDConfig | None = None
    acknowledged: LiveSettings | None = None
    applied_locally: bool = False
    stats: dict[str, Any] | None = None


AdminMessage = AdminRequest | AdminReply


def _builtin_number(obj: Any) -> Any:
    """msgspec encodes exact builtin numbers only; counters may arrive as numpy/torch scalars."""
    if hasattr(obj, "item"):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


class _Codec:
    """Encodes and decodes one family of messages (a union of tagged structs)."""

    def __init__(self, family: Any, name: str, enc_hook: Any = None) -> None:
        self.name = name
        self.types: tuple[type, ...] = family.__args__
        self._decoder = msgspec.msgpack.Decoder(family)
        self._encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)

    def decode(self, frame: bytes) -> Any:
        try:
            return self._decoder.decode(frame)
        except msgspec.DecodeError:
            raise
        except Exception as err:  # e.g. UnicodeDecodeError for a garbled tag (found by the fuzz)
            raise msgspec.DecodeError(f"{type(err).__name__}: {err}") from err

    def encode(self, msg: Any) -> bytes:
        if not isinstance(msg, self.types):
            raise TypeError(f"not {self.name} message: {type(msg).__name__}")
        frame = self._encoder.encode(msg)
        try:
            self._decoder.decode(frame)
        except msgspec.DecodeError as err:
            raise ValueError(f"invalid {type(msg).__name__}: {err}") from err
        return frame


_LINK = _Codec(Message, "a control")
_ADMIN = _Codec(AdminMessage, "an admin", enc_hook=_builtin_number)
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


def decode_admin(frame: bytes) -> AdminMessage:
    """Decode one frame of the admin bridge; raises as `decode` does."""
    return _ADMIN.decode(frame)


def encode_admin(msg: AdminMessage) -> bytes:
    """Encode one admin message, checked by decoding it back; raises as `encode` does."""
    return _ADMIN.encode(msg)


def schema_digest() -> str:
    """SHA-256 (hex) of the JSON schema of every message and struct this module defines (public
    names, sorted; descriptions and titles left out, so docstrings may change freely): it
    changes whenever a field, a type, a constraint, a default or a tag does, i.e. whenever
    `PROTOCOL_VERSION` must (tests/transport/test_protocol_version.py)."""
    types = sorted(
        (
            value
            for name, value in globals().items()
            if inspect.isclass(value)
            and issubclass(value, msgspec.Struct)
            and value.__module__ == __name__
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

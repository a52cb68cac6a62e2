"""What both message families of the SSD transport share: field bounds and types, the errors,
the struct bases, the codec, and the live settings both carry.

The link messages (target ↔ speculator, `messages`) and the admin messages (HTTP process ↔
scheduler, `admin_messages`) are separate families with separate codecs, so neither can be sent
on the other's socket. Every struct is frozen and refuses unknown fields; field ranges are msgspec
`Meta` constraints (checked on decode), cross-field rules live in ``__post_init__`` (checked on
construction *and* decode). A codec's `encode` re-decodes what it produced, so a sender cannot
put a frame on the wire that the peer would reject; its `decode` is safe on untrusted input and
raises only `msgspec.DecodeError` (`msgspec.ValidationError` is a subclass).
"""

from __future__ import annotations

import math
import typing
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from sglang_ssd.config import LIVE_FIELDS, SSDConfig, check_setting

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


class TransportError(RuntimeError):
    """The SSD link failed: handshake rejected, peer gone, tensor transfer failed."""


class TransportTimeout(TransportError, TimeoutError):
    """A wait on the SSD link ran past its timeout."""


class RemoteError(TransportError):
    """The peer answered with an `Error` message; ``reason`` is its text."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"peer reported an error: {reason}")
        self.reason = reason


class Struct(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Payload pieces nested inside messages (untagged)."""


class Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    """Base of every top-level message; the ``type`` tag selects the class on decode."""


def unique(what: str, rids: list[str]) -> None:
    if len(set(rids)) != len(rids):
        raise ValueError(f"{what} names a request more than once")


def finite(what: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value}")


class _LiveSettingsBase(Struct, omit_defaults=True):
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


class Codec:
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

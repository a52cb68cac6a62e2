"""The admin bridge's messages: the HTTP process asks the scheduler for `/ssd/config` and
`/ssd/stats` (`sglang_ssd.integration.admin`) with `AdminRequest` and gets `AdminReply`, through
its own codec (`encode_admin` / `decode_admin`), apart from the link's (`messages`). The live
settings it carries, `wire.LiveSettings`, are generated from `SSDConfig`'s declarations.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from sglang_ssd.config import LIVE_FIELDS, SSDConfig
from sglang_ssd.transport.wire import Codec, LiveSettings, Message, Text

AdminOp = Literal["config", "configure", "stats"]


class AdminRequest(Message, tag="admin_request"):
    """HTTP process → scheduler: read the settings (``config``), change live ones
    (``configure``, with the `changes`), or read the counters (``stats``)."""

    op: AdminOp
    changes: LiveSettings | None = None

    def __post_init__(self) -> None:
        if (self.op == "configure") != (self.changes is not None):
            raise ValueError("changes go with op 'configure', and only with it")
        if self.changes is not None and not self.changes.given():
            raise ValueError(f"no settings to change; settable: {', '.join(LIVE_FIELDS)}")


class AdminReply(Message, tag="admin_reply"):
    """Scheduler → HTTP process: one `AdminRequest`'s answer, as an HTTP status and the parts of
    the body its op returns.

    status/error: HTTP status, and why when not 200. config (ops config, configure): the
    settings, as given at startup or changed since (None where chosen at run time). in_force
    (ops config, configure): the value of each setting in force now, never None
    (`admin.in_force`). acknowledged (configure): the live settings
    the speculator applied, or, with `applied_locally`, the changes the target applied without
    one (none running, or it did not answer). stats (stats): `/ssd/stats`'s counters, free-form
    (the round timer's and the speculator's counters, the miss policy's state).
    """

    status: Annotated[int, Meta(ge=100, le=599)] = 200
    error: Text = ""
    config: SSDConfig | None = None
    in_force: dict[str, Any] | None = None
    acknowledged: LiveSettings | None = None
    applied_locally: bool = False
    stats: dict[str, Any] | None = None


AdminMessage = AdminRequest | AdminReply


def _builtin_number(obj: Any) -> Any:
    """msgspec encodes exact builtin numbers only; counters may arrive as numpy/torch scalars."""
    if hasattr(obj, "item"):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ADMIN = Codec(AdminMessage, "an admin", enc_hook=_builtin_number)


def decode_admin(frame: bytes) -> AdminMessage:
    """Decode one frame of the admin bridge; raises as `decode` does."""
    return _ADMIN.decode(frame)


def encode_admin(msg: AdminMessage) -> bytes:
    """Encode one admin message, checked by decoding it back; raises as `encode` does."""
    return _ADMIN.encode(msg)

"""Control messages: round trips, validation rules and a decoder fuzz (no pickle, no crash)."""

from __future__ import annotations

import typing

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_ssd.config import LIVE_FIELDS, SSDConfig
from sglang_ssd.transport import admin_messages as am
from sglang_ssd.transport import messages as m
from sglang_ssd.transport import wire

SAMPLING = m.SamplingSpec(temperature=0.7, top_k=-1, top_p=0.95, seed=7)
DRAFTS = m.Drafts(
    step_id=3,
    entries=[
        m.DraftEntry(rid="a", source=m.DraftSource.CACHE, depth=4, has_q=True),
        m.DraftEntry(rid="b", source=m.DraftSource.NGRAM, depth=2, has_q=False),
        m.DraftEntry(rid="c", source=m.DraftSource.MISSING, depth=0, has_q=False),
    ],
    max_depth=4,
    vocab_size=151936,
    q_dtype="bfloat16",
    timing=m.SpeculatorTiming(build_s=0.5, lookup_s=1e-4, backup_s=0.0),
)
STATS = m.StatsReply(
    stats=m.SpeculatorStats(
        steps=3,
        send_s=0.25,
        cache_hits=3,
        kv_exhausted=2,
        kv_exhausted_builds=2,
        fanout_outcomes={4: 3},
        fanout_hits={4: 2},
        builds_at_depth={2: 3},
    )
)
EXAMPLES: list[m.Message] = [
    m.Hello(version=m.PROTOCOL_VERSION, role="speculator", pid=123, session="s"),
    m.HelloAck(version=m.PROTOCOL_VERSION, accepted=False, reason="version mismatch"),
    m.Open(rid="a", token_ids=[1, 2, 151935], sampling=SAMPLING),
    m.Open(rid="g", token_ids=[], sampling=m.SamplingSpec(0.0, 1, 1.0, None)),
    m.Close(rid="a"),
    m.Step(
        step_id=4,
        outcomes=[m.Outcome(rid="a", accept_len=3, bonus=9)],
        requests=["a", "b"],
        backup="ngram",
    ),
    DRAFTS,
    m.Configure(
        changes=wire.LiveSettings(beta=0.5, fanout_budget=20, fanout="uniform", backup="auto")
    ),
    m.Configure(),
    m.ConfigureAck(applied=wire.LiveSettings.of(SSDConfig(backup="jit"))),
    m.StatsRequest(),
    m.StatsReply(stats=m.SpeculatorStats()),
    STATS,
    m.Shutdown(),
    m.Error(reason="unknown request"),
]
# q at the draft vocabulary's columns (appended: OUT_OF_RANGE indexes above).
HELLO_COLUMNS = m.Hello(
    version=m.PROTOCOL_VERSION, role="speculator", pid=1, session="s", q_columns=[0, 7, 151935]
)
DRAFTS_COLUMNS = msgspec.structs.replace(DRAFTS, q_columns=65558)
EXAMPLES += [HELLO_COLUMNS, DRAFTS_COLUMNS]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda msg: type(msg).__name__)
def test_round_trip(msg: m.Message) -> None:
    decoded = m.decode(m.encode(msg))
    assert decoded == msg and type(decoded) is type(msg)


def test_every_message_type_has_an_example() -> None:
    assert {type(msg) for msg in EXAMPLES} == set(m.MESSAGE_TYPES)


def test_drafts_counts_q_rows_and_bytes() -> None:
    assert DRAFTS.n_q == 1
    assert DRAFTS.tensor_bytes() == 3 * 4 * 8 + 1 * 4 * 151936 * 2
    assert DRAFTS.q_width == 151936 and DRAFTS_COLUMNS.q_width == 65558
    assert DRAFTS_COLUMNS.tensor_bytes() == 3 * 4 * 8 + 1 * 4 * 65558 * 2


def _as_dict(msg: m.Message) -> dict:
    return msgspec.to_builtins(msg)


def _patched(msg: m.Message, path: tuple, value: object) -> bytes:
    obj = _as_dict(msg)
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return msgspec.msgpack.encode(obj)


OUT_OF_RANGE = [
    (EXAMPLES[5], ("step_id",), -1),
    (EXAMPLES[5], ("outcomes", 0, "accept_len"), -2),
    (EXAMPLES[5], ("outcomes", 0, "bonus"), 2**40),
    (EXAMPLES[5], ("backup",), "greedy"),
    (EXAMPLES[5], ("requests",), ["a", "a"]),
    (EXAMPLES[5], ("requests",), [""]),
    (EXAMPLES[2], ("token_ids",), [1, -5]),
    (EXAMPLES[2], ("sampling", "top_p"), 0.0),
    (EXAMPLES[2], ("sampling", "top_k"), 0),
    (EXAMPLES[2], ("sampling", "temperature"), float("nan")),
    (EXAMPLES[2], ("sampling", "temperature"), float("inf")),
    (DRAFTS, ("entries", 0, "depth"), 5),  # > max_depth
    (DRAFTS, ("entries", 0, "depth"), -1),
    (DRAFTS, ("entries", 1, "has_q"), True),  # an n-gram draft has no q
    (DRAFTS, ("entries", 2, "depth"), 1),  # a missing draft has depth 0
    (DRAFTS, ("entries", 0, "source"), "oracle"),
    (DRAFTS, ("q_dtype",), "float64"),
    (DRAFTS, ("vocab_size",), 0),
    (DRAFTS, ("vocab_size",), 2**24 + 1),
    (DRAFTS, ("timing", "build_s"), -0.1),
    (EXAMPLES[7], ("changes", "beta"), 0.0),
    (EXAMPLES[7], ("changes", "beta"), "x"),
    (EXAMPLES[7], ("changes", "fanout"), "triangular"),
    (EXAMPLES[7], ("changes", "fanout_budget"), -1),
    (EXAMPLES[7], ("changes", "mode"), "turbo"),
    (EXAMPLES[7], ("changes", "draft_vocab"), 100),  # not a live setting
    (EXAMPLES[9], ("applied", "backup"), None),  # an ack reports every live setting
    (STATS, ("stats", "steps"), -1),
    (STATS, ("stats", "send_s"), -0.1),
    (STATS, ("stats", "hit_exponent"), float("nan")),
    (STATS, ("stats", "kv_exhausted"), 3),  # not drafts + builds
    (STATS, ("stats", "fanout_hits"), {"4": 2}),  # keyed by F, an int
    (STATS, ("stats", "counters"), {}),  # unknown field
    (EXAMPLES[0], ("role",), "client"),
    (EXAMPLES[5], ("extra",), 1),  # unknown field
    (EXAMPLES[5], ("type",), "steps"),  # unknown tag
    (HELLO_COLUMNS, ("q_columns",), [0, 7, 7]),  # not distinct
    (HELLO_COLUMNS, ("q_columns",), [7, 0]),  # not ascending
    (HELLO_COLUMNS, ("q_columns",), []),
    (HELLO_COLUMNS, ("q_columns",), [-1, 3]),
    (DRAFTS_COLUMNS, ("q_columns",), 151937),  # more columns than ids
]


@pytest.mark.parametrize("msg,path,value", OUT_OF_RANGE, ids=lambda x: str(x)[:20])
def test_decoder_rejects_bad_values(msg: m.Message, path: tuple, value: object) -> None:
    with pytest.raises(msgspec.ValidationError):
        m.decode(_patched(msg, path, value))


def test_construction_and_encode_check_values() -> None:
    with pytest.raises(ValueError, match="has no q"):
        m.DraftEntry(rid="a", source="random", depth=1, has_q=True)
    with pytest.raises(ValueError, match="more than once"):
        m.Step(step_id=0, outcomes=[], requests=["a", "a"], backup="jit")
    with pytest.raises(ValueError, match="names a core more than once"):
        m.Step(step_id=0, outcomes=[], requests=["a"], backup="jit", draft_cpus=[1, 1])
    with pytest.raises(ValueError, match="invalid Step"):
        m.encode(m.Step(step_id=-1, outcomes=[], requests=[], backup="jit"))
    with pytest.raises(TypeError):
        m.encode({"type": "shutdown"})  # only Structs go on the wire
    big = [m.DraftEntry(rid=str(i), source="jit", depth=8, has_q=True) for i in range(9)]
    with pytest.raises(ValueError, match="exceed"):
        m.Drafts(step_id=0, entries=big, max_depth=8, vocab_size=2**24)


def test_live_settings_are_the_live_fields_of_ssd_config() -> None:
    hints = typing.get_type_hints(SSDConfig)
    assert LIVE_FIELDS == ("mode", "tree_depth", "fanout_budget", "fanout", "beta", "backup")
    assert wire.LiveSettings.__struct_fields__ == LIVE_FIELDS
    for name, kind in typing.get_type_hints(wire.LiveSettings).items():
        assert kind == hints[name] | None, name
    settings = wire.LiveSettings.of(SSDConfig(beta=0.25))
    assert settings.given() == {
        "mode": "auto",
        "fanout_budget": 8,
        "fanout": "predicted",
        "beta": 0.25,
        "backup": "auto",
    }
    assert wire.LiveSettings(fanout="uniform").given() == {"fanout": "uniform"}
    with pytest.raises(ValueError, match="--ssd-beta must be in"):
        wire.LiveSettings(beta=1.5)


def test_draft_sources_are_one_enum() -> None:
    assert [s.value for s in m.DraftSource] == ["cache", "jit", "ngram", "random", "missing"]
    decoded = m.decode(m.encode(DRAFTS))
    assert [e.source for e in decoded.entries] == ["cache", "ngram", "missing"]
    assert all(type(e.source) is m.DraftSource for e in decoded.entries)


ADMIN_EXAMPLES = [
    am.AdminRequest(op="config"),
    am.AdminRequest(op="configure", changes=wire.LiveSettings(beta=0.5, backup="ngram")),
    am.AdminRequest(op="stats"),
    am.AdminReply(config=SSDConfig(tree_depth=3, draft_device="cpu", draft_cpus=(1, 2))),
    am.AdminReply(
        config=SSDConfig(),
        acknowledged=wire.LiveSettings(beta=0.5),
        applied_locally=True,
    ),
    am.AdminReply(stats={"rounds": 3, "rounds_by_source": {"cache": 2}, "fallback": {"x": None}}),
    am.AdminReply(status=409, error="no speculator"),
]


@pytest.mark.parametrize("msg", ADMIN_EXAMPLES, ids=lambda msg: type(msg).__name__)
def test_admin_round_trip(msg: am.AdminMessage) -> None:
    decoded = am.decode_admin(am.encode_admin(msg))
    assert decoded == msg and type(decoded) is type(msg)


@pytest.mark.parametrize(
    "msg,path,value",
    [
        (ADMIN_EXAMPLES[0], ("op",), "reboot"),
        (ADMIN_EXAMPLES[0], ("changes",), {"beta": 0.5}),  # changes only with configure
        (ADMIN_EXAMPLES[1], ("changes",), {}),  # configure needs some change
        (ADMIN_EXAMPLES[1], ("changes",), None),
        (ADMIN_EXAMPLES[1], ("changes", "beta"), 0.0),
        (ADMIN_EXAMPLES[1], ("changes", "beta"), True),
        (ADMIN_EXAMPLES[1], ("changes", "tree_depth"), -1),
        (ADMIN_EXAMPLES[3], ("config", "beta"), 2.0),
        (ADMIN_EXAMPLES[3], ("config", "tree_depth"), 9),  # > γ
        (ADMIN_EXAMPLES[3], ("status",), 42),
    ],
    ids=lambda x: str(x)[:20],
)
def test_admin_decoder_rejects_bad_values(msg: am.AdminMessage, path: tuple, value: object) -> None:
    with pytest.raises(msgspec.ValidationError):
        am.decode_admin(_patched(msg, path, value))


def test_admin_and_link_messages_do_not_mix() -> None:
    with pytest.raises(TypeError):
        m.encode(ADMIN_EXAMPLES[0])
    with pytest.raises(TypeError):
        am.encode_admin(m.Shutdown())
    with pytest.raises(msgspec.ValidationError):
        m.decode(am.encode_admin(ADMIN_EXAMPLES[0]))
    with pytest.raises(msgspec.ValidationError):
        am.decode_admin(m.encode(m.Shutdown()))


def test_hello_stays_decodable_across_versions() -> None:
    future = _as_dict(EXAMPLES[0]) | {"version": 99, "capabilities": ["x"]}
    hello = m.decode(msgspec.msgpack.encode(future))
    assert isinstance(hello, m.Hello) and hello.version == 99


# --- fuzz ---------------------------------------------------------------------------------

builtins_ = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
TAGS = [cls.__struct_config__.tag for cls in m.MESSAGE_TYPES]


def _shaped_like(draw: st.DrawFn) -> dict:
    """A valid message's dict with one field replaced by a random value (wrong type or range)."""
    obj = _as_dict(draw(st.sampled_from(EXAMPLES)))
    if len(obj) > 1:
        key = draw(st.sampled_from(sorted(k for k in obj if k != "type")))
        obj[key] = draw(builtins_)
    return obj


@st.composite
def bad_frames(draw: st.DrawFn) -> tuple[str, bytes]:
    """(kind, frame): random bytes, garbled or truncated msgpack, wrong shapes, unknown tags."""
    kind = draw(st.sampled_from(["bytes", "truncated", "flipped", "shape", "tag", "structure"]))
    valid = m.encode(draw(st.sampled_from(EXAMPLES)))
    if kind == "bytes":
        return kind, draw(st.binary(max_size=64))
    if kind == "truncated":
        return kind, valid[: draw(st.integers(0, len(valid) - 1))]
    if kind == "flipped":
        pos = draw(st.integers(0, len(valid) - 1))
        flip = draw(st.integers(1, 255))
        return kind, valid[:pos] + bytes([valid[pos] ^ flip]) + valid[pos + 1 :]
    if kind == "shape":
        return kind, msgspec.msgpack.encode(_shaped_like(draw))
    if kind == "tag":
        tag = draw(st.text(max_size=12).filter(lambda t: t not in TAGS))
        return kind, msgspec.msgpack.encode({**_as_dict(EXAMPLES[5]), "type": tag})
    return kind, msgspec.msgpack.encode(draw(builtins_))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_frames())
def test_decoder_fuzz(case: tuple[str, bytes]) -> None:
    """The decoder raises DecodeError (nothing else) or yields a message that re-encodes."""
    kind, frame = case
    try:
        msg = m.decode(frame)
    except msgspec.DecodeError:
        return
    assert kind in ("flipped", "shape", "structure"), f"{kind} frame decoded: {frame!r}"
    frame = m.encode(msg)  # compared as bytes: a NaN counter is not equal to itself
    assert m.encode(m.decode(frame)) == frame

"""A changed message changes `PROTOCOL_VERSION`.

`messages.schema_digest()` fingerprints every message's schema (fields, types, constraints,
defaults, tags; not docstrings). Each protocol version is recorded here with its fingerprint:
after changing a message, bump `PROTOCOL_VERSION` (the commit says what changed) and add the
new version with the digest this test prints. Never edit a recorded entry.
"""

from __future__ import annotations

import msgspec

from sglang_ssd.transport import messages

# version -> schema_digest() of the messages at that version (recorded from 7 on).
RECORDED = {
    7: "43681cfeac99ebc6f34a1a0c68050aeb01a664e4efcaba73513f1bbdb9ff9430",
    8: "978570826c342f0a9161f37e4e2536282bcf9eb1469df0d0f6bd9affe0477e29",
    9: "5102772235a35abda54207def6f1dd5771d40b4af652edbe2ee94ca362140f04",
    10: "cf0fe42762535e9b7ce5f1b8e039d0f22205e069fa20d8a1cc09e5ef5837f872",
    11: "994abc951e84d844464d7bb3ae985b29f4b9fbb5b96aebc696b1fda87f5e2a64",
    12: "e98ccb1f4b177938f34078e6cf0645a26834f35393199a23cc95807f4ca80802",
    13: "28a2ed3f67110ede1a6ffce26dd06e122d106f3c7cc0ce1e168fbd64abc5bc94",
    14: "fadc031dcae547bb3bf99639c6d33d5258eec51a4924027be5c2e36b0abbbbd7",
}


def test_the_declared_version_is_the_one_recorded_for_these_messages() -> None:
    digest = messages.schema_digest()
    versions = [v for v, d in RECORDED.items() if d == digest]
    assert versions, (
        f"the messages changed (schema digest {digest}): bump PROTOCOL_VERSION (now "
        f"{messages.PROTOCOL_VERSION}) and record the new version with this digest"
    )
    assert versions == [messages.PROTOCOL_VERSION], (
        f"these messages are protocol version {versions}, but PROTOCOL_VERSION says "
        f"{messages.PROTOCOL_VERSION}"
    )
    assert max(RECORDED) == messages.PROTOCOL_VERSION, "a newer version is recorded"


def test_the_digest_sees_a_field_change_but_not_a_docstring() -> None:
    before = messages.schema_digest()

    class Extra(messages._Message, tag="extra_for_test"):
        """A message added for this test only."""

        n: int

    Extra.__module__ = messages.__name__
    try:
        messages.Extra = Extra  # a new public message: the digest must change
        assert messages.schema_digest() != before
    finally:
        del messages.Extra
    assert messages.schema_digest() == before
    original = messages.Close.__doc__
    try:
        messages.Close.__doc__ = "Reworded."
        assert messages.schema_digest() == before
    finally:
        messages.Close.__doc__ = original
    assert isinstance(msgspec.json.schema(messages.Close), dict)

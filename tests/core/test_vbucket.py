"""The one vbucket state type: a wire number with a name; and key hashing."""

from __future__ import annotations

import pytest

from dcpkv.core.vbucket import VBucketState, vbucket_for_key


def test_a_state_is_its_wire_number_and_shows_its_name() -> None:
    assert VBucketState.ACTIVE == 1 and VBucketState.DEAD == 4
    assert VBucketState.REPLICA.label == "replica"
    assert str(VBucketState.PENDING) == f"{VBucketState.PENDING}" == "pending"


def test_a_state_converts_from_its_number_or_its_name() -> None:
    assert VBucketState(3) is VBucketState("pending") is VBucketState.from_label("pending")
    for bad in (0, 5, "asleep"):
        with pytest.raises(ValueError):
            VBucketState(bad)


def test_vbucket_for_key_is_the_sdk_crc() -> None:
    # CRC32 of b"foo" is 0x8c736521: (0x8c73 & 0x7fff) % 1024
    assert vbucket_for_key(b"foo", 1024) == (0x8C73 & 0x7FFF) % 1024
    assert all(0 <= vbucket_for_key(b"k%d" % i, 64) < 64 for i in range(100))

"""The durability requirement of a flex request's framing extras: the codec's table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.core.status import Status
from dcpkv.protocol.constants import DurabilityLevel
from dcpkv.protocol.durability import (
    DurabilityRequirement,
    at_least,
    durability_requirement,
    level_named,
)
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import encode_stream_id

MAJORITY = DurabilityLevel.Majority
PERSIST = DurabilityLevel.PersistToMajority


@pytest.mark.parametrize(
    ("framing", "expected"),
    [
        (b"", None),
        (encode_stream_id(7), None),  # another item only
        (bytes.fromhex("1301 1388"), DurabilityRequirement(MAJORITY, 5000)),  # the spec's example
        (bytes.fromhex("1102"), DurabilityRequirement(DurabilityLevel.MajorityAndPersistToActive)),
        (bytes.fromhex("1103"), DurabilityRequirement(PERSIST)),
        (encode_stream_id(7) + bytes.fromhex("1101"), DurabilityRequirement(MAJORITY)),
        (bytes.fromhex("1101 1103"), DurabilityRequirement(MAJORITY)),  # the first counts
    ],
)
def test_requirements_read(framing: bytes, expected: DurabilityRequirement | None) -> None:
    assert durability_requirement(framing) == expected


@pytest.mark.parametrize(
    ("framing", "status"),
    [
        (bytes.fromhex("1100"), Status.DurabilityInvalidLevel),  # level 0 is never valid
        (bytes.fromhex("1109"), Status.DurabilityInvalidLevel),
        (bytes.fromhex("1309 1388"), Status.DurabilityInvalidLevel),
        (bytes.fromhex("1301 0000"), Status.Einval),  # reserved timeouts
        (bytes.fromhex("1301 ffff"), Status.Einval),
        (bytes.fromhex("120113"), Status.Einval),  # neither 1 nor 3 bytes
        (bytes.fromhex("10"), Status.Einval),
        (bytes.fromhex("f0"), Status.Einval),  # an escaped id, truncated
        (bytes.fromhex("1401"), Status.Einval),  # overruns the framing extras
    ],
)
def test_malformed_requirements_refused(framing: bytes, status: Status) -> None:
    with pytest.raises(CodecError) as caught:
        durability_requirement(framing)
    assert caught.value.status == status


@given(
    level=st.sampled_from(list(DurabilityLevel)),
    timeout=st.none() | st.integers(min_value=1, max_value=0xFFFE),
)
def test_encode_then_read_is_identity(level: DurabilityLevel, timeout: int | None) -> None:
    requirement = DurabilityRequirement(level, timeout)
    assert durability_requirement(requirement.encode()) == requirement


@pytest.mark.parametrize("timeout", [0, 0xFFFF, 70_000])
def test_encode_refuses_reserved_timeouts(timeout: int) -> None:
    with pytest.raises(CodecError):
        DurabilityRequirement(MAJORITY, timeout).encode()


PERSIST_ACTIVE, PERSIST = (
    DurabilityLevel.MajorityAndPersistToActive,
    DurabilityLevel.PersistToMajority,
)


@pytest.mark.parametrize(
    ("requirement", "minimum", "expected"),
    [
        (None, None, None),  # no minimum: nothing changes
        (DurabilityRequirement(MAJORITY, 500), None, DurabilityRequirement(MAJORITY, 500)),
        (None, MAJORITY, DurabilityRequirement(MAJORITY)),  # a plain write becomes durable
        (DurabilityRequirement(MAJORITY, 500), PERSIST, DurabilityRequirement(PERSIST, 500)),
        (DurabilityRequirement(PERSIST), PERSIST_ACTIVE, DurabilityRequirement(PERSIST)),
        (
            DurabilityRequirement(PERSIST_ACTIVE),
            PERSIST_ACTIVE,
            DurabilityRequirement(PERSIST_ACTIVE),
        ),
    ],
)
def test_the_bucket_minimum_raises_every_write(
    requirement: DurabilityRequirement | None,
    minimum: DurabilityLevel | None,
    expected: DurabilityRequirement | None,
) -> None:
    assert at_least(requirement, minimum) == expected


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("none", None),
        ("majority", MAJORITY),
        ("majorityAndPersistActive", PERSIST_ACTIVE),
        ("persistToMajority", PERSIST),
        ("PERSIST_TO_MAJORITY", PERSIST),  # the SDK's name
    ],
)
def test_level_names(name: str, level: DurabilityLevel | None) -> None:
    assert level_named(name) == level


def test_a_name_that_is_no_level() -> None:
    with pytest.raises(ValueError, match="persistToMajority"):
        level_named("all")

"""A request's durability requirement: framing-extras item 1 of a flex request (magic 0x08).

The item holds a level byte (:class:`~dcpkv.protocol.constants.DurabilityLevel`: 1 Majority,
2 MajorityAndPersistToActive, 3 PersistToMajority), then optionally a timeout in milliseconds
(big-endian u16): ``13 01 13 88`` is Majority with 5 s. What the codec refuses, in order:

=====================================================  ========================================
item                                                   answer
=====================================================  ========================================
data of a length other than 1 or 3                      Einval
level outside 1..3 (0 is never valid)                  DurabilityInvalidLevel (0xa0)
timeout 0 or 0xffff (both reserved)                     Einval
=====================================================  ========================================

A refusal is per request: the frame's boundaries are intact, so the connection goes on. Only
the first durability item of a frame counts (the reference sends one).

The levels' names in settings (the bucket's ``durability_min_level``, the commands' options)
are the reference's: ``none``, ``majority``, ``majorityAndPersistActive``,
``persistToMajority`` (:func:`level_named`; any case, and the SDK's upper-case names).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from dcpkv.core.status import Status
from dcpkv.protocol.constants import DurabilityLevel, FramingId
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import Bytes, encode_framing_item, framing_items

_TIMEOUT = struct.Struct(">H")
_RESERVED_TIMEOUTS = frozenset({0, 0xFFFF})


@dataclass(frozen=True, slots=True)
class DurabilityRequirement:
    """What a request asks of its write: a level, and a timeout in ms (None: the server's)."""

    level: DurabilityLevel
    timeout_ms: int | None = None

    def encode(self) -> bytes:
        """The framing-extras item that carries this requirement."""
        data = bytes((self.level,))
        if self.timeout_ms is not None:
            if not 0 < self.timeout_ms < 0xFFFF:
                raise CodecError(Status.Einval, f"durability timeout {self.timeout_ms} ms")
            data += _TIMEOUT.pack(self.timeout_ms)
        return encode_framing_item(FramingId.RequestDurability, data)


LEVEL_NAMES = ("none", "majority", "majorityAndPersistActive", "persistToMajority")
_BY_NAME: dict[str, DurabilityLevel | None] = {
    "none": None,
    "majority": DurabilityLevel.Majority,
    "majorityandpersistactive": DurabilityLevel.MajorityAndPersistToActive,
    "majority_and_persist_to_active": DurabilityLevel.MajorityAndPersistToActive,
    "persisttomajority": DurabilityLevel.PersistToMajority,
    "persist_to_majority": DurabilityLevel.PersistToMajority,
}


def level_named(name: str) -> DurabilityLevel | None:
    """The level a setting names (None: ``none``); ValueError for a name that is no level."""
    try:
        return _BY_NAME[name.strip().lower()]
    except KeyError:
        raise ValueError(
            f"durability level {name!r}: use one of {', '.join(LEVEL_NAMES)}"
        ) from None


def at_least(
    requirement: DurabilityRequirement | None, minimum: DurabilityLevel | None
) -> DurabilityRequirement | None:
    """``requirement`` raised to the bucket's ``minimum`` level (its timeout kept); a write
    with no requirement gets the minimum with the default timeout; no minimum changes
    nothing."""
    if minimum is None or (requirement is not None and requirement.level >= minimum):
        return requirement
    timeout = None if requirement is None else requirement.timeout_ms
    return DurabilityRequirement(minimum, timeout)


def durability_requirement(framing: Bytes) -> DurabilityRequirement | None:
    """The requirement a request's framing extras carry, None when they carry none."""
    for item_id, data in framing_items(framing):
        if item_id == FramingId.RequestDurability:
            return _decode(data)
    return None


def _decode(data: memoryview) -> DurabilityRequirement:
    if len(data) not in (1, 3):
        raise CodecError(Status.Einval, f"durability requirement of {len(data)} bytes")
    try:
        level = DurabilityLevel(data[0])
    except ValueError:
        raise CodecError(
            Status.DurabilityInvalidLevel, f"durability level {data[0]} is not 1, 2 or 3"
        ) from None
    if len(data) == 1:
        return DurabilityRequirement(level)
    timeout = _TIMEOUT.unpack_from(data, 1)[0]
    if timeout in _RESERVED_TIMEOUTS:
        raise CodecError(Status.Einval, f"durability timeout {timeout} ms is reserved")
    return DurabilityRequirement(level, timeout)

"""What every layer knows of a vbucket: which keys it holds and which state it is in.

Theory of operation
-------------------
Keys map to vbuckets by CRC32, as the SDKs compute it: the client picks the vbucket, the
server only checks it owns it. A vbucket is active (serves reads and writes), replica
(receives a copy over DCP), pending (a replica about to take over) or dead (handed over,
refuses everything). The state travels on the wire as a number (SetVbucket, DCP
SetVbucketState, GetAllVbSeqnos) and is stored, shown in stats and messages, by name
(``"active"``). :class:`VBucketState` is both: an ``IntEnum`` whose value is the wire number
and whose :attr:`~VBucketState.label` (also its ``str()``) is the name. ``VBucketState("active")``
is accepted as well, so a stored or typed name converts the way a wire number does.
"""

from __future__ import annotations

import zlib
from enum import IntEnum


def vbucket_for_key(key: bytes, num_vbuckets: int) -> int:
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % num_vbuckets


class VBucketState(IntEnum):
    ACTIVE = 1
    REPLICA = 2
    PENDING = 3
    DEAD = 4

    @property
    def label(self) -> str:
        """The name a vbucket state is stored and shown by: ``active``, ``replica``..."""
        return _LABELS[self]  # (``name`` is a slow descriptor; the flusher asks per vbucket)

    @classmethod
    def from_label(cls, label: str) -> VBucketState:
        try:
            return cls[label.upper()]
        except KeyError:
            raise ValueError(f"{label!r} is not a vbucket state") from None

    @classmethod
    def of(cls, value: int | str) -> VBucketState:
        """``VBucketState(value)`` with its types spelled out: a wire number or a stored name
        (the enum's call accepts both through ``_missing_``, but is typed for numbers only)."""
        if isinstance(value, int):
            return cls(value)
        member = cls._missing_(value)
        if member is None:
            raise ValueError(f"{value!r} is not a valid {cls.__name__}")
        return member

    @classmethod
    def _missing_(cls, value: object) -> VBucketState | None:
        # Called only when ``value`` is no wire number: let a stored name convert too.
        return cls.__members__.get(value.upper()) if isinstance(value, str) else None

    def __str__(self) -> str:
        return self.label


_LABELS = {state: state.name.lower() for state in VBucketState}

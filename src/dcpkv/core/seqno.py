"""Sequence numbers and history uuids: unsigned 64-bit numbers.

Theory of operation
-------------------
Every change to a vbucket gets the next seqno; every history branch is named by a random
uuid. Both are unsigned 64-bit on the wire, in storage and in offsets, so one range check
serves them all. The aliases say which number a signature means; they are plain ``int`` at
run time (no wrapping on the hot path).

A seqno (and a rev seqno) goes no higher than :data:`SEQNO_MAX`, 2**63-1, although the wire
carries 64 bits: kv_engine keeps them in int64, our storage's rows in signed 64-bit fields, and the
Spark source in BIGINT columns. The front end issues one per write, so it never gets there on
its own; a vbucket refuses a write that would pass it, and a replica refuses a replicated
seqno, rev seqno or snapshot end beyond it (a foreign producer's), with a message that says so.
"""

from __future__ import annotations

from typing import Any, TypeAlias

U64_MAX = (1 << 64) - 1
SEQNO_MAX = (1 << 63) - 1

Seqno: TypeAlias = int
VbUuid: TypeAlias = int


def is_u64(value: Any) -> bool:
    """An ``int`` (never a ``bool``: JSON ``true`` is not a seqno) in 0..2^64-1."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX

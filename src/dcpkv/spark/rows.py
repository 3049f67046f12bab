"""The source's rows: a fixed schema, and change events turned into Arrow record batches.

Theory of operation
-------------------
One row per change (``mutation``, ``deletion``, ``expiration``) and one per ``rollback``.
Every unsigned 64-bit number (``cas``, ``rev_seqno``, ``seqno``, ``vb_uuid``, ``snap_start``,
``snap_end``) is ``DECIMAL(20,0)``: Spark has no unsigned long, a signed long would turn
values from 2**63 up negative, and a string would sort wrongly. Decimal(20, 0) holds every
u64 exactly and compares numerically. ``flags`` (u32) and ``expiry`` are ``LONG``.

A rollback row carries ``vbucket`` and, in ``seqno``, the seqno downstream must roll back to:
drop every change of that vbucket with a higher seqno received *before* the rollback row. The
changes of the new branch follow it. Every other field of a rollback row is null.

Rows are handed to Spark as Arrow record batches, built column by column straight from the
events (:func:`event_batches`): a batch of mutations only (the usual case) makes each column
with one comprehension over the events, no tuple per row; a batch with deletions or rollbacks
goes through row tuples (:func:`to_batch`). The u64 columns are built as ``uint64`` and cast
to decimal in Arrow (five times cheaper than Python ints to decimals). :data:`BATCH_ROWS`
rows per batch: large enough that Arrow's and Spark's per-batch costs vanish, small enough
that a task's memory stays a few MB.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from dcpkv.client import events

BATCH_ROWS = 8192
U64 = pa.decimal128(20, 0)

SCHEMA_DDL = (
    "op STRING, vbucket INT, key BINARY, value BINARY, datatype INT, flags BIGINT, "
    "expiry BIGINT, cas DECIMAL(20,0), rev_seqno DECIMAL(20,0), seqno DECIMAL(20,0), "
    "vb_uuid DECIMAL(20,0), snap_start DECIMAL(20,0), snap_end DECIMAL(20,0)"
)
ARROW_SCHEMA = pa.schema(
    [
        ("op", pa.string()),
        ("vbucket", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("datatype", pa.int32()),
        ("flags", pa.int64()),
        ("expiry", pa.int64()),
        ("cas", U64),
        ("rev_seqno", U64),
        ("seqno", U64),
        ("vb_uuid", U64),
        ("snap_start", U64),
        ("snap_end", U64),
    ]
)
COLUMNS = tuple(ARROW_SCHEMA.names)

Row = tuple[Any, ...]
_OPS = {events.Mutation: "mutation", events.Deletion: "deletion", events.Expiration: "expiration"}


def change_row(event: events.Mutation | events.Deletion | events.Expiration, values: bool) -> Row:
    o = event.offset
    value: bytes | None
    datatype: int | None
    flags: int | None
    expiry: int | None
    if isinstance(event, events.Mutation):
        # Without values the producer sends none (DCP NoValue) and no datatype either.
        value, datatype = (event.value, event.datatype) if values else (None, None)
        flags, expiry = event.flags, event.expiration
    else:
        value = datatype = flags = expiry = None
    return (
        _OPS[type(event)], event.vbucket, event.key, value, datatype, flags, expiry,
        event.cas, event.rev_seqno, event.seqno, o.vb_uuid, o.snap_start, o.snap_end,
    )  # fmt: skip


def rollback_row(vbucket: int, seqno: int) -> Row:
    return ("rollback", vbucket, None, None, None, None, None, None, None, seqno, None, None, None)


def event_row(event: events.Event, values: bool) -> Row | None:
    """The row for an event, or None for events downstream does not see (markers, ...)."""
    if isinstance(event, events.Mutation | events.Deletion | events.Expiration):
        return change_row(event, values)
    if isinstance(event, events.Rollback):
        return rollback_row(event.vbucket, event.rollback_seqno)
    return None


def _u64(values: list[Any]) -> pa.Array:
    return pa.array(values, type=pa.uint64()).cast(U64)


_TYPES = [f.type for f in ARROW_SCHEMA]
_U64_COLUMNS = frozenset(i for i, t in enumerate(_TYPES) if t == U64)


def to_batch(rows: list[Row]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    arrays = [
        _u64(list(col)) if i in _U64_COLUMNS else pa.array(col, type=_TYPES[i])
        for i, col in enumerate(columns)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def mutations_batch(evs: list[events.Mutation], values: bool) -> pa.RecordBatch:
    """The batch of ``evs``, all :class:`~dcpkv.client.events.Mutation`: a column each."""
    n = len(evs)
    offsets = [e.offset for e in evs]
    if values:
        value = pa.array([e.value for e in evs], type=pa.binary())
        datatype = pa.array([e.datatype for e in evs], type=pa.int32())
    else:  # without values the producer sends none (DCP NoValue) and no datatype either
        value, datatype = pa.nulls(n, pa.binary()), pa.nulls(n, pa.int32())
    arrays = [
        pa.array(["mutation"] * n, type=pa.string()),
        pa.array([e.vbucket for e in evs], type=pa.int32()),
        pa.array([e.key for e in evs], type=pa.binary()),
        value,
        datatype,
        pa.array([e.flags for e in evs], type=pa.int64()),
        pa.array([e.expiration for e in evs], type=pa.int64()),
        _u64([e.cas for e in evs]),
        _u64([e.rev_seqno for e in evs]),
        _u64([e.seqno for e in evs]),
        _u64([o.vb_uuid for o in offsets]),
        _u64([o.snap_start for o in offsets]),
        _u64([o.snap_end for o in offsets]),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def events_batch(evs: list[Any], values: bool) -> pa.RecordBatch:
    """The batch of change and rollback events ``evs``."""
    if all(type(e) is events.Mutation for e in evs):
        return mutations_batch(evs, values)
    rows = [event_row(e, values) for e in evs]
    return to_batch([r for r in rows if r is not None])


_ROW_EVENTS = (events.Mutation, events.Deletion, events.Expiration, events.Rollback)


def event_batches(
    evs: Iterator[events.Event], values: bool, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """The rows of a stream of events (those that make one), ``batch_rows`` at a time."""
    pending: list[Any] = []
    for ev in evs:
        if isinstance(ev, _ROW_EVENTS):
            pending.append(ev)
            if len(pending) >= batch_rows:
                yield events_batch(pending, values)
                pending = []
    if pending:
        yield events_batch(pending, values)


def batches(rows: Iterator[Row], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Row tuples (``documents`` mode) as batches of ``batch_rows``."""
    pending: list[Row] = []
    for row in rows:
        pending.append(row)
        if len(pending) >= batch_rows:
            yield to_batch(pending)
            pending = []
    if pending:
        yield to_batch(pending)

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

Rows are handed to Spark as Arrow record batches (much cheaper than a Python tuple per row):
:class:`RowBuffer` collects columns and cuts a batch every :data:`BATCH_ROWS` rows.
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


class RowBuffer:
    """Rows in, Arrow record batches out (columns are built once per batch)."""

    def __init__(self, batch_rows: int = BATCH_ROWS) -> None:
        self.batch_rows = batch_rows
        self.rows: list[Row] = []

    def add(self, row: Row) -> pa.RecordBatch | None:
        self.rows.append(row)
        if len(self.rows) >= self.batch_rows:
            return self.flush()
        return None

    def flush(self) -> pa.RecordBatch | None:
        if not self.rows:
            return None
        batch = to_batch(self.rows)
        self.rows = []
        return batch


def to_batch(rows: list[Row]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    arrays = [pa.array(col, type=f.type) for col, f in zip(columns, ARROW_SCHEMA, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def batches(rows: Iterator[Row], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    buffer = RowBuffer(batch_rows)
    for row in rows:
        batch = buffer.add(row)
        if batch is not None:
            yield batch
    last = buffer.flush()
    if last is not None:
        yield last

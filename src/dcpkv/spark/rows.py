"""The source's rows: a fixed schema, and change events turned into Arrow record batches.

Theory of operation
-------------------
One row per change (``mutation``, ``deletion``, ``expiration``) and one per ``rollback``.
This module holds the schema (built from ``columns.py``'s list, which a planner process reads
without pyarrow), the one place the mirror, the views and the backup take their columns from
(:func:`spark_fields`, ``columns.SCHEMA_DDL``).

The six 64-bit numbers are ``BIGINT`` (Spark ``LongType``, Arrow ``int64``), as in the
official Couchbase Spark connector. They were ``DECIMAL(20,0)`` (exact for all of u64), but a
decimal of precision above 18 is a ``BigDecimal`` object per value inside Spark: it made a
query about twice as slow. Two kinds:

* seqnos (``seqno``, ``rev_seqno``, ``snap_start``, ``snap_end``, :data:`SEQNO_COLUMNS`):
  signed, their plain value. kv_engine keeps seqnos in int64 and so does our server (its
  replica path refuses one beyond); a foreign server's seqno >= 2**63 stops the task with a
  :class:`RowRangeError` naming the vbucket and the value, never a silent wrap.
* identifiers and clocks (``cas``, ``vb_uuid``, :data:`BIT_PATTERN_COLUMNS`): the u64's 64
  bits, two's complement, so values from 2**63 up read negative: lossless, and equality is
  unchanged (a vb_uuid is an identifier; a CAS from the hybrid logical clock stays below 2**63
  until the year 2262, one set through SetWithMeta can be any u64). The unsigned value in
  Spark: ``pmod(cast(cas as decimal(20,0)), 18446744073709551616)``.

``flags`` (u32) and ``expiry`` are ``BIGINT`` too.

A rollback row carries ``vbucket`` and, in ``seqno``, the seqno downstream must roll back to:
drop every change of that vbucket with a higher seqno received *before* the rollback row. The
changes of the new branch follow it. Every other field of a rollback row is null.

Rows are handed to Spark as Arrow record batches, built column by column straight from the
events (:func:`event_batches`): a batch of mutations only (the usual case) makes each column
with one comprehension over the events, no tuple per row; a batch with deletions or rollbacks
goes through row tuples (:func:`to_batch`). A bit-pattern column is built as ``uint64`` and
viewed as ``int64`` (no copy); a seqno column is built as ``int64``, whose overflow error is
turned into the clear one. :data:`BATCH_ROWS` rows per batch: large enough that Arrow's and
Spark's per-batch costs vanish, small enough that a task's memory stays a few MB.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from dcpkv.client import events
from dcpkv.core.errors import DcpkvError
from dcpkv.core.seqno import SEQNO_MAX
from dcpkv.spark.columns import COLUMN_TYPES, COLUMNS

BATCH_ROWS = 8192
SEQNO_COLUMNS = ("rev_seqno", "seqno", "snap_start", "snap_end")
BIT_PATTERN_COLUMNS = ("cas", "vb_uuid")

_ARROW_TYPES = {"STRING": pa.string(), "INT": pa.int32(), "BIGINT": pa.int64(),
                "BINARY": pa.binary()}  # fmt: skip
ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES[sql]) for name, sql in COLUMN_TYPES])


class RowRangeError(DcpkvError, ValueError):
    """A seqno the BIGINT columns cannot hold (>= 2**63), from a server that sent one."""


def spark_fields(*names: str) -> list[Any]:
    """The Spark ``StructField`` of each named column (the mirror and the views store some
    of the source's columns as they are)."""
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField

    spark_types = {pa.string(): StringType, pa.int32(): IntegerType, pa.int64(): LongType,
                   pa.binary(): BinaryType}  # fmt: skip
    return [StructField(n, spark_types[ARROW_SCHEMA.field(n).type]()) for n in names]


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


def bits(values: Sequence[int | None]) -> pa.Array:
    """A u64 column as BIGINT: the same 64 bits, values from 2**63 up negative."""
    return pa.array(values, type=pa.uint64()).view(pa.int64())


def seqnos(values: Sequence[int | None], vbuckets: Sequence[int], name: str) -> pa.Array:
    """A seqno column as BIGINT; a value beyond it is a :class:`RowRangeError` naming the
    first such value and its vbucket (``vbuckets``: the rows' vbuckets)."""
    try:
        return pa.array(values, type=pa.int64())
    except OverflowError:
        vb, value = next(
            (vb, v) for vb, v in zip(vbuckets, values, strict=True) if v and v > SEQNO_MAX
        )
        raise RowRangeError(
            f"vbucket {vb}: {name} {value} is beyond 2^63-1: the source's seqno columns are "
            "BIGINT (kv_engine keeps seqnos in int64 too), and this server sent a larger one"
        ) from None


_TYPES = [f.type for f in ARROW_SCHEMA]
_SEQNO_AT = frozenset(COLUMNS.index(n) for n in SEQNO_COLUMNS)
_BITS_AT = frozenset(COLUMNS.index(n) for n in BIT_PATTERN_COLUMNS)
_VBUCKET_AT = COLUMNS.index("vbucket")


def to_batch(rows: list[Row]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    vbuckets = columns[_VBUCKET_AT]
    arrays = [
        seqnos(col, vbuckets, COLUMNS[i]) if i in _SEQNO_AT
        else bits(col) if i in _BITS_AT
        else pa.array(col, type=_TYPES[i])
        for i, col in enumerate(columns)
    ]  # fmt: skip
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def mutations_batch(evs: list[events.Mutation], values: bool) -> pa.RecordBatch:
    """The batch of ``evs``, all :class:`~dcpkv.client.events.Mutation`: a column each."""
    n = len(evs)
    offsets = [e.offset for e in evs]
    vbuckets = [e.vbucket for e in evs]
    if values:
        value = pa.array([e.value for e in evs], type=pa.binary())
        datatype = pa.array([e.datatype for e in evs], type=pa.int32())
    else:  # without values the producer sends none (DCP NoValue) and no datatype either
        value, datatype = pa.nulls(n, pa.binary()), pa.nulls(n, pa.int32())
    arrays = [
        pa.array(["mutation"] * n, type=pa.string()),
        pa.array(vbuckets, type=pa.int32()),
        pa.array([e.key for e in evs], type=pa.binary()),
        value,
        datatype,
        pa.array([e.flags for e in evs], type=pa.int64()),
        pa.array([e.expiration for e in evs], type=pa.int64()),
        bits([e.cas for e in evs]),
        seqnos([e.rev_seqno for e in evs], vbuckets, "rev_seqno"),
        seqnos([e.seqno for e in evs], vbuckets, "seqno"),
        bits([o.vb_uuid for o in offsets]),
        seqnos([o.snap_start for o in offsets], vbuckets, "snap_start"),
        seqnos([o.snap_end for o in offsets], vbuckets, "snap_end"),
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

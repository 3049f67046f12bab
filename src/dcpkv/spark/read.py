"""What a Spark task does: stream its vbuckets between two offsets with the client library.

Theory of operation
-------------------
A task gets a list of :class:`~dcpkv.spark.plan.VbTarget` (start position, end seqno) and
opens ONE :class:`~dcpkv.client.sync.SyncConsumer` for all of them (the facade hands events
over in chunks, so a task pays no thread hop per event, and its loop thread answers noops
while Spark turns rows into Arrow batches). The start positions become
the client's :class:`~dcpkv.client.offsets.Offsets` (with each vbucket's ancestry from the
producer's failover log, so a rollback lands on a known branch: the logs are asked for all
at once, not one round trip each) and the end seqnos the
stream's explicit ends. The library finishes a vbucket only at StreamEnd OK, which the
producer sends once the end seqno is reached; every other stream end (the server restarted,
a slow stream was cut, the connection died) is resumed by the library from the offset, so a
task never counts a vbucket done early and never skips a change.

A Rollback event becomes a rollback row *before* the changes of the new branch, which the
library then streams from the rollback point. Nothing is ever dropped silently.

History cut below the planned end (the server was killed with unpersisted writes and
restarted between planning and reading, or while the task read). The end seqno E was planned
on branch U, which the restart killed: the new branch keeps U's history only up to its
branch point P (< E) and its high seqno H may stay below E for good, so waiting for the
producer to reach E could wait forever. The stream therefore asks the library to clamp each
end (``clamp_ends``): before every stream request the end becomes min(E, the vbucket's high
seqno at that moment). On an unchanged branch that is E itself (a branch's high seqno never
drops below a seqno read from it); only a cut history ends the vbucket early, at a consistent
point of the new branch (the producer clamps the last snapshot to the end).

Why downstream stays exact although the batch read less than it was planned to: Spark
commits the *planned* end offset (U, E), not what the task read. Whenever the clamp bit, H < E,
so U is dead with its successor branched at P <= H < E, and the next ``latestOffset`` finds
(U, E) on a dead branch: the producer's rule answers a rollback to at most P, the plan lands on
the newest point R <= P that the offset knows, and the next batch starts with a rollback row R
followed by the new branch from R. Everything this batch wrote above R (the old branch's tail
and the new branch's first changes alike) is dropped by that row and streamed again, so the
end state is the new branch's, exactly. The same holds when the clamp did not bite but the
task met a rollback anyway (H grew past E before the re-request): (U, E) is still on a dead
branch and is rolled back again. Rows above R are thus read twice, once per batch; a restart
is rare enough that exactness is worth it.

The cyclic garbage collector is paused while a task reads (:func:`collector_paused`). A
batch's pending events are thousands of tracked objects that live until the batch is built,
so CPython's young collections kept scanning them and every few batches a full collection
walked the whole worker (pyspark, pyarrow, our modules): about 1 us of a task's 3.5 us of
CPU per row. Streaming makes next to no cyclic garbage (a couple of dozen objects a task,
all freed when the collector is back on at the task's end), and reference counting frees
the events and batches as before, so the pause costs no memory.

``documents`` mode reads every vbucket from 0 to the planned seqno and folds the changes into
the last version of every key, dropping deleted and expired ones. It keeps each vbucket's
changes as a list in seqno order until the end, because a rollback mid-read (the server
restarted) must fall back to the versions at or below the rollback point, which a "latest
only" map has already thrown away.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence

import pyarrow as pa

from dcpkv.client import events
from dcpkv.client.settings import ClientSettings
from dcpkv.client.sync import SyncConsumer
from dcpkv.spark.plan import VbTarget
from dcpkv.spark.rows import Row, batches, change_row, event_batches
from dcpkv.spark.sparkoffsets import SparkOffsets


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside (module docstring); a pause already in force stays."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def change_batches(
    config: ClientSettings, work: Sequence[VbTarget], values: bool
) -> Iterator[pa.RecordBatch]:
    """A task's rows in ``changes`` mode: every change and rollback of ``work``, as batches."""
    with collector_paused():
        yield from event_batches(stream_events(config, work), values)


def document_batches(
    config: ClientSettings, work: Sequence[VbTarget], values: bool
) -> Iterator[pa.RecordBatch]:
    """A task's rows in ``documents`` mode (:func:`document_rows`), as batches."""
    with collector_paused():
        yield from batches(document_rows(config, work, values))


def stream_events(config: ClientSettings, work: Sequence[VbTarget]) -> Iterator[events.Event]:
    """Every event of ``work``'s vbuckets from their start positions to their end seqnos."""
    if not work:
        return
    vbs = [t.vbucket for t in work]
    with SyncConsumer(config) as consumer:
        # The ancestry matters only for a branch other than "nothing yet" (uuid 0).
        logs = consumer.failover_logs([t.vbucket for t in work if t.start.offset.vb_uuid])
        start = SparkOffsets({t.vbucket: t.start for t in work}).client_offsets(vbs, logs)
        ends = {t.vbucket: t.end for t in work}
        yield from consumer.stream(vbs, start=start, end=ends, clamp_ends=True)


def document_rows(config: ClientSettings, work: Sequence[VbTarget], values: bool) -> Iterator[Row]:
    """The live documents of ``work``'s vbuckets as of their end seqnos (one row per key)."""
    changes: dict[int, list[Row]] = {t.vbucket: [] for t in work}
    for event in stream_events(config, work):
        if isinstance(event, events.Rollback):
            kept = changes[event.vbucket]
            while kept and kept[-1][9] > event.rollback_seqno:  # [9]: seqno
                kept.pop()
        elif isinstance(event, events.Mutation | events.Deletion | events.Expiration):
            changes[event.vbucket].append(change_row(event, values))
    for vb in sorted(changes):
        latest: dict[bytes, Row] = {}
        for row in changes[vb]:
            latest[row[2]] = row  # [2]: key; seqno order, so the last one wins
        yield from (row for row in latest.values() if row[0] == "mutation")

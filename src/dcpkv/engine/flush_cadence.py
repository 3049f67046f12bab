"""When the flusher writes a bucket's backlog: at once, or after letting a sparse one gather.

Theory of operation
-------------------
A flush's cost is per vbucket it touches as well as per item: every vbucket it touches writes
its state and a flush point (about 9 us of flusher CPU each, docs/storage.md), so a light load
spread over the default 1,024 vbuckets makes the worst flushes, a few items per vbucket each
paying that. The same items in fewer, larger flushes share it: the same items cost 6.8-7.6 us
an item over 64 vbuckets against 10.7 over 1,024.

So a backlog that is *sparse* (few items per vbucket it touches) and *young* waits; anything
else is written at once. :func:`due` decides per bucket, every flusher tick, from a
:class:`Backlog` the bucket keeps in O(1):

====  ==============================================================  ===========
case  the backlog                                                     flush now?
====  ==============================================================  ===========
N     nothing to write                                                no
W     someone waits on the disk: a client asked whether a write is    yes
      persisted (ObserveSeqno below the high seqno, SeqnoPersistence),
      a writer is held by write backpressure, or the bucket refuses
      writes over its memory quota until values can be ejected
S     a vbucket's state, failover log or rollback is to be written    yes
      (the cluster manager's and warm-up's changes stay prompt)
B     at least :data:`BIG_FLUSH_ITEMS` items, now or in the previous   yes
      flush (a sustained or fast load keeps its cadence, back to back
      under load; a tick that finds fewer after a stall of the writers
      does not make the next flush twice as big)
D     at least :data:`DENSE_ITEMS_PER_VBUCKET` items per vbucket      yes
      touched (a narrow load: nothing to gain by waiting)
A     the oldest unpersisted write is :data:`SPARSE_WAIT_INTERVALS`   yes
      flush intervals old (0.15 s at the default 50 ms)
G     sparse and young                                                no: gather
====  ==============================================================  ===========

Why 2,048 items is big enough. Past it a flush's per-vbucket cost is well shared, and
a larger one holds the event loop back longer with its Python work (taking the batches,
building the rows): with 4,096, a 50k writes/s load over 1,024 vbuckets gathered for ~80 ms
and the live stream's p99 (write acknowledged -> DCP mutation received) rose from 4.9-5.0 to
5.6-6.1 ms in a paired run. At 2,048 that load flushes as it did before (a tick that finds
fewer, after the writers were held up a moment, is not deferred either: the previous flush was
big; without that rule 3 ticks in 100 were, each making a flush twice the size), and the gain stays
where it is large: measured at 10k writes/s over 1,024 vbuckets (``bench/latency.py``, a DCP
consumer on every vbucket), 4.0-4.2 -> 1.1 kB written to disk and 31-39 -> 28-34 us of
server CPU per write; with the writer alone, 6.6 -> 2.2 kB and a flusher thread using half
the CPU it did.

What it costs. A write nobody asks about is persisted up to three flush intervals after it is
acknowledged instead of up to one, so a kill -9 of a lightly loaded node can lose up to
0.15 s of writes instead of 0.05 s (docs/server.md's bound, half a second, is write
backpressure's and holds: the longest wait stays under its 0.25 s, as the limit is five
intervals when intervals are longer). A client that asks gets the flush it asks for at the
next tick (case W), so PersistTo polling, SeqnoPersistence and a rebalance's waits for
persistence (ObserveSeqno) see no change. DCP streams from memory and is not affected.
"""

from __future__ import annotations

from dataclasses import dataclass

BIG_FLUSH_ITEMS = 2048
DENSE_ITEMS_PER_VBUCKET = 4
SPARSE_WAIT_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class Backlog:
    """What a bucket has to write, as :func:`due` reads it."""

    items: int  # items queued since the last flush took its batches
    vbuckets: int  # vbuckets with something to write (items or state)
    lag_s: float  # age of the oldest acknowledged, unpersisted write
    state: bool  # a vbucket's state, failover log or rollback is among it
    wanted: bool  # a client asked about persistence since the last flush, or writes wait on it
    last_flush: int = 0  # items the previous flush wrote


def due(backlog: Backlog, interval_s: float, *, waiting: bool = False) -> bool:
    """Whether to flush ``backlog`` now (the module docstring's table); ``waiting``: someone
    waits on the server's disk (parked SeqnoPersistence requests, writers held)."""
    if backlog.vbuckets == 0:
        return False  # N
    if waiting or backlog.wanted:
        return True  # W
    if backlog.state:
        return True  # S
    if backlog.items >= BIG_FLUSH_ITEMS or backlog.last_flush >= BIG_FLUSH_ITEMS:
        return True  # B
    if backlog.items >= DENSE_ITEMS_PER_VBUCKET * backlog.vbuckets:
        return True  # D
    return backlog.lag_s >= SPARSE_WAIT_INTERVALS * interval_s  # A, else G

"""Background fetches: a front-end request that needs a key's persisted version waits for it
off the event loop (kv_engine's BgFetcher), and the vbucket's table of such pending reads.

Theory of operation
-------------------
A Get, GetMeta, a write or a sub-document request on a key the hash table does not hold while
the vbucket counts non-resident items (full eviction), or on a key whose value was ejected,
must read storage. With a background fetcher running (``VBucket.background_fetch``), the
vbucket never reads storage on the caller's thread for such a request: it raises
:class:`WouldBlock` instead, before it has changed anything; the caller (the server's
connection) parks the request, asks for the key (:meth:`PendingFetches.want`), and runs the
request again, from the start, once the read has landed. The re-run finds the result in
:attr:`PendingFetches.ready` and completes as the synchronous path would have. A key that
storage's bloom filters rule out needs no read at all (``may_exist``: no I/O, a few
microseconds): a Set of a new key, a Get of a missing one, are answered at once.

The table, one per vbucket (guarded by the vbucket's lock), takes each key through:

=============== =========================== ====================================================
step            method                      what changes
=============== =========================== ====================================================
asked           :meth:`want`                the waiter joins the key's waiters; the first one
                                            (True) makes the key *wanted*: the fetcher is told
taken           :meth:`take`                wanted keys become *in flight* (valid), read by
                                            the fetcher thread in one multi-get, no lock held
dropped         :meth:`dropped`,            a version of the key left the hash table while it
                :meth:`dropped_all`         was in flight or ready (evicted, a persisted
                                            tombstone discarded, a rollback's reset): what was
                                            read may be older than what left, so it is not used
landed          :meth:`landed`              the read is done: still valid, it becomes
                                            *ready*; the key's waiters are handed back to be run
                                            again (all of them: an invalid read makes each ask
                                            again)
consumed        :meth:`consumed`            the waiters ran: the ready result is forgotten
=============== =========================== ====================================================

Why a result is right when used. Every front-end request of a vbucket runs on one thread (the
event loop); storage's version of a key is read only for a key the hash table does not hold
(or holds without its value: those paths check the version's seqno). While the read is in
flight a write to the key lands in the hash table, which the re-run reads first: the newer
item wins and the fetched one is not put back over it. For the fetched version to be stale,
a newer version must have been in the table and left it again (only a persisted version is
evicted, only a persisted tombstone discarded), which :meth:`dropped` records. Several
requests for one key share one read (coalescing); the keys of several requests, of several
vbuckets, are read in one batch.

A read that fails lands as the :class:`~dcpkv.engine.item.TempFail` its waiters answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dcpkv.core.errors import DcpkvError
from dcpkv.engine.item import Item, TempFail

Waiter = Callable[[], None]
# What a read lands as: the persisted version (None: storage has none), or the refusal of a
# read that failed.
Fetched = Item | None | TempFail


class WouldBlock(DcpkvError):
    """A front-end request needs storage's version of ``key`` in ``vbucket`` (a
    :class:`~dcpkv.engine.vbucket.VBucket`) and nothing was changed: fetch it in the
    background, then run the request again. Not an EngineError: never answered to a client
    (nothing catches DcpkvError on a request's way)."""

    def __init__(self, vbucket: Any, key: bytes) -> None:
        super().__init__(f"vbucket {vbucket.id}: key {key!r} must be read from storage")
        self.vbucket = vbucket
        self.key = key


class PendingFetches:
    """One vbucket's pending background fetches (module docstring). Not thread-safe: its
    vbucket's lock guards it."""

    __slots__ = ("_in_flight", "_waiters", "_wanted", "ready")

    def __init__(self) -> None:
        self._waiters: dict[bytes, list[Waiter]] = {}  # wanted or in flight -> who waits
        self._wanted: list[bytes] = []  # asked, not yet taken by the fetcher, in order
        self._in_flight: dict[bytes, bool] = {}  # taken -> still valid (no version dropped)
        # Landed and valid, while its waiters run again: key -> storage's version
        self.ready: dict[bytes, Fetched] = {}

    def __bool__(self) -> bool:
        """Whether any key is wanted, in flight or ready (the drop hooks test this first)."""
        return bool(self._waiters or self.ready)

    @property
    def waiting(self) -> int:
        """Keys with waiters (wanted or in flight)."""
        return len(self._waiters)

    def want(self, key: bytes, waiter: Waiter) -> bool:
        """``waiter`` waits for ``key``; True when the key was not asked for yet (the
        fetcher must be told), False when it joins a pending read."""
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.append(waiter)
            return False
        self._waiters[key] = [waiter]
        self._wanted.append(key)
        return True

    def take(self) -> list[bytes]:
        """The wanted keys, now in flight (the fetcher reads them)."""
        keys, self._wanted = self._wanted, []
        for key in keys:
            self._in_flight[key] = True
        return keys

    def watched(self) -> Iterable[bytes]:
        """The keys whose drop matters: in flight or ready."""
        return [*self._in_flight, *self.ready]

    def dropped(self, key: bytes) -> None:
        """A version of ``key`` left the hash table: what is in flight or ready for it may be
        older, so it is not used."""
        if key in self._in_flight:
            self._in_flight[key] = False
        self.ready.pop(key, None)

    def dropped_all(self) -> None:
        """The whole table was replaced (a rollback's reset, a warm-up): nothing in flight or
        ready is used."""
        for key in self._in_flight:
            self._in_flight[key] = False
        self.ready.clear()

    def landed(self, key: bytes, fetched: Fetched) -> list[Waiter]:
        """The read of ``key`` (taken) is done: ready if still valid; returns its waiters,
        to be run again (then :meth:`consumed`)."""
        if self._in_flight.pop(key, False):
            self.ready[key] = fetched
        return self._waiters.pop(key, [])

    def consumed(self, key: bytes) -> None:
        """The waiters of ``key`` ran again: its result is forgotten (the next request that
        needs it reads again)."""
        self.ready.pop(key, None)

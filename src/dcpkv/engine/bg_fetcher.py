"""The background fetcher: one thread per bucket that reads the keys the vbuckets' pending
fetch tables want (:mod:`dcpkv.engine.bg_fetch`), in batches, off the event loop.

Theory of operation
-------------------
A vbucket whose table has a newly wanted key notes itself here (:meth:`BgFetcher.notify`,
from the loop, under the vbucket's lock: it only takes note). The thread wakes, takes the
wanted keys of every noted vbucket (each under its vbucket's lock, briefly), and reads them all
in one storage multi-get (``get_many``: RocksDB's multi-get gives up the interpreter lock while
it reads, so the loop goes on serving meanwhile) with no vbucket lock held. The results go to
``landed`` (the server hops them onto its loop: :meth:`dcpkv.engine.bucket.Bucket.land_fetches`
runs the waiting requests again there). Requests that arrive while a batch is read form the
next batch: the busier the loop, the larger the batches. A caller about to ask for many keys
at once (a connection's pipelined Gets behind the one that waits) holds the thread back
meanwhile (:meth:`BgFetcher.hold`, :meth:`BgFetcher.release`): they are read in one batch and
land together, so its requests run again in one go and are answered in one write, rather than
in as many pieces as the thread happened to wake up for while they were asked.

A read that fails (a damaged file, a closed database) lands as a TempFail for each key of the
batch; the thread goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dcpkv.engine.bg_fetch import Fetched
from dcpkv.engine.item import Item, TempFail
from dcpkv.engine.vbucket import VBucket

log = logging.getLogger(__name__)

MAX_BATCH = 1024  # keys read in one multi-get (the rest wait for the next)

Reader = Callable[[list[tuple[int, bytes]]], list[Item | None]]
# One batch's results: (the vbucket, the key, what the read found)
Landing = list[tuple[VBucket, bytes, Fetched]]


class BgFetcher:
    """The thread of one bucket's background fetches (module docstring)."""

    def __init__(self, name: str, read: Reader, landed: Callable[[Landing], None]) -> None:
        self._read = read
        self._landed = landed
        self._noted: dict[int, VBucket] = {}  # id(vbucket) -> vbucket, in order
        self._cv = threading.Condition(threading.Lock())
        self._stopped = False
        self._holds = 0  # callers gathering a batch (the thread does not take one meanwhile)
        self.batches = 0  # multi-gets made (a stat)
        self.keys_read = 0
        self._thread = threading.Thread(target=self._run, name=f"bgfetch-{name}", daemon=True)
        self._thread.start()

    def notify(self, vbucket: VBucket) -> None:
        """``vbucket`` has wanted keys (any thread; it only takes note)."""
        with self._cv:
            if not self._noted:
                self._cv.notify()
            self._noted[id(vbucket)] = vbucket

    def hold(self) -> None:
        """Keys noted from now on wait until :meth:`release` (any thread; each hold is
        released once): they go to the thread as one batch."""
        with self._cv:
            self._holds += 1

    def release(self) -> None:
        with self._cv:
            self._holds -= 1
            if not self._holds and self._noted:
                self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cv:
                while (not self._noted or self._holds) and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                noted, self._noted = list(self._noted.values()), {}
            try:
                self._fetch(noted)
            except Exception:  # a defect must not end background fetches for good
                log.exception("background fetch failed")

    def _fetch(self, vbuckets: list[VBucket]) -> None:
        wanted: list[tuple[VBucket, bytes]] = []
        for vbucket in vbuckets:
            with vbucket.lock:
                keys = vbucket.fetches.take()
            wanted += [(vbucket, key) for key in keys]
        for start in range(0, len(wanted), MAX_BATCH):
            part = wanted[start : start + MAX_BATCH]
            self._landed(self._read_batch(part))

    def _read_batch(self, part: list[tuple[VBucket, bytes]]) -> Landing:
        self.batches += 1
        self.keys_read += len(part)
        try:
            found: list[Fetched] = list(self._read([(vb.id, key) for vb, key in part]))
        except Exception as exc:
            log.warning("background fetch of %d keys failed: %s", len(part), exc)
            failed = TempFail(f"reading the key from storage failed ({exc}); retry")
            found = [failed] * len(part)
        return [(vb, key, item) for (vb, key), item in zip(part, found, strict=True)]

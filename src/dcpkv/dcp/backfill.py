"""Disk backfills of DCP streams, read off the event loop (kv_engine's backfill manager).

Theory of operation
-------------------
A stream whose start is no longer in memory reads a *disk snapshot*
(:meth:`BucketStorage.open_stream_backfill`), so everything it sends is one consistent state of
the disk however long the consumer takes. Reading it is blocking I/O plus per-row work, which
must not run on the server's event loop: a stream backfilling a large vbucket would stall
every other connection for as long.

:class:`DiskBackfill` (one per backfill of a stream) is read in *batches* of
:data:`BATCH_ROWS` rows by a :class:`BackfillRunner`. Each batch is encoded by a function the
stream gives (the rows become DCP messages in the worker, joined into runs of consecutive items,
so the loop only forwards bytes) and lands in the backfill's buffer; the stream takes a run of
about :data:`~dcpkv.dcp.active_stream.BATCH_ITEMS` items out of it at a time. When a
batch lands from another thread, the backfill calls the stream's ``notify`` (the producer's
thread-safe notification), which is how a stream idle for want of data comes back to the
ready queue.

Runners
    :class:`InlineRunner` reads a batch at once in the caller's thread: the sans-I/O default,
    so a producer driven by a test is deterministic. :class:`BackfillThread` is one worker
    thread with a FIFO of read tasks, shared by every producer of a server; the server gives
    it to each producer (:meth:`BackfillManager.attach`).

Memory bound
    A backfill holds at most two batches (the one its stream is taking from and the next
    one), and a read is only started while the producer's :class:`BackfillManager` has less
    than ``buffer_bytes`` buffered across all its streams; backfills that must wait queue in
    FIFO order and start as the stream side frees bytes. A slow consumer therefore costs at
    most ``buffer_bytes`` plus one batch per producer: what it has not read stays on disk.

Threads and closing
    Only the runner touches the storage's scan while a read is in flight. ``close`` (the
    stream ended, the connection went away) marks the backfill closed and closes the scan at
    once when no read is in flight, else the read closes it when it lands. A small lock guards
    those flags and the buffer; it is never held during a read.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dcpkv.engine.storage import BackfillScan, StreamRow

BATCH_ROWS = 2048  # rows a read takes from disk at once
# Reads of one producer in flight at once: its streams take turns on the worker, and what is
# buffered can overshoot the bound by at most one batch.
MAX_READS = 1
DEFAULT_BUFFER_BYTES = 8 << 20  # per producer, across its streams' backfills

log = logging.getLogger("dcpkv.dcp.backfill")


Run = tuple[bytes, int, int]  # (the joined messages of items, the last one's seqno, how many)


@dataclass(slots=True)
class Batch:
    """A batch of rows encoded as *runs*: each run is the wire bytes of consecutive item
    messages joined into one bytes object (so the event loop forwards a run with per-run, not
    per-item, work), with the seqno of its last item and its item count; ``pos`` counts the
    runs taken already."""

    runs: list[Run]
    nbytes: int
    pos: int = 0


Encoder = Callable[[list[StreamRow]], Batch]


class BackfillRunner(Protocol):
    """Where backfill reads run. ``inline`` runners run them at once, in the caller."""

    inline: bool

    def submit(self, task: Callable[[], None]) -> None: ...


class InlineRunner:
    """Reads at once, in the calling thread (tests, tools: deterministic, sans-I/O)."""

    inline = True

    def submit(self, task: Callable[[], None]) -> None:
        task()


class BackfillThread:
    """One worker thread running backfill reads in FIFO order (started on first use)."""

    inline = False

    def __init__(self, name: str = "dcpkv-backfill") -> None:
        self._name = name
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._tasks.put(task)

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except Exception:  # a task records its own failure; this is a last resort
                log.exception("backfill task failed")

    def stop(self, timeout: float | None = 10.0) -> None:
        """Finish the queued reads and end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._tasks.put(None)
            thread.join(timeout)


class BackfillManager:
    """A producer's backfills: which runner reads them, and the bound on what they buffer."""

    def __init__(
        self, runner: BackfillRunner | None = None, buffer_bytes: int = DEFAULT_BUFFER_BYTES
    ) -> None:
        self.runner: BackfillRunner = runner or InlineRunner()
        self.buffer_bytes = buffer_bytes
        self.buffered = 0  # bytes read and not yet taken by their stream
        self.reading = 0  # reads submitted and not landed yet
        self._waiting: deque[DiskBackfill] = deque()
        self._lock = threading.Lock()

    def attach(self, runner: BackfillRunner) -> None:
        """Run later reads on ``runner`` (the server's worker thread)."""
        self.runner = runner

    def _request(self, backfill: DiskBackfill) -> None:
        """Start a read for ``backfill`` now if the bounds allow, else queue it (FIFO)."""
        with self._lock:
            if self.reading >= MAX_READS or self.buffered >= self.buffer_bytes:
                if backfill not in self._waiting:
                    self._waiting.append(backfill)
                return
            self.reading += 1
        if not backfill._start_read():
            self._read_done(0)

    def _read_done(self, nbytes: int) -> None:
        """A read landed with ``nbytes`` buffered (any thread)."""
        with self._lock:
            self.reading -= 1
            self.buffered += nbytes
        self._start_waiting()

    def _released(self, nbytes: int) -> None:
        """A stream took ``nbytes`` out of its buffer."""
        with self._lock:
            self.buffered -= nbytes
        self._start_waiting()

    def _start_waiting(self) -> None:
        with self._lock:
            if self.reading >= MAX_READS or self.buffered >= self.buffer_bytes:
                return
            if not self._waiting:
                return
            backfill = self._waiting.popleft()
        self._request(backfill)

    def _forget(self, backfill: DiskBackfill) -> None:
        with self._lock:
            if backfill in self._waiting:
                self._waiting.remove(backfill)


class DiskBackfill:
    """One disk snapshot of one stream, read in batches off the caller's thread."""

    def __init__(
        self,
        manager: BackfillManager,
        open_scan: Callable[[], BackfillScan[StreamRow]],
        encode: Encoder,
        notify: Callable[[], None],
    ) -> None:
        self._manager = manager
        self._open_scan = open_scan
        self._encode = encode
        self._notify = notify
        self._scan: BackfillScan[StreamRow] | None = None
        self._batches: deque[Batch] = deque()
        self._lock = threading.Lock()
        self._reading = False
        self._closed = False
        self._error: BaseException | None = None
        # Set by the reader once the snapshot is open; ``end`` before ``opened``.
        self.start = self.end = self.purge_seqno = self.high_completed_seqno = 0
        self.opened = False
        self.exhausted = False  # every row read (maybe not all taken yet)

    @property
    def finished(self) -> bool:
        """Every row was read and every message taken."""
        return self.exhausted and not self._batches

    def request(self) -> None:
        """Make sure a read is on its way if the buffer has room (the stream's side)."""
        self._raise_error()
        with self._lock:
            if self._reading or self._closed or self.exhausted or len(self._batches) > 1:
                return
        self._manager._request(self)

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _start_read(self) -> bool:
        with self._lock:
            if self._reading or self._closed or self.exhausted or len(self._batches) > 1:
                return False
            self._reading = True
        self._manager.runner.submit(self._read)
        return True

    def take(self, n: int) -> list[Run] | None:
        """Runs of about ``n`` items (at least one run, of the batch at the head); None while
        nothing is buffered."""
        self.request()
        with self._lock:
            if not self._batches:
                self._raise_error()  # an inline read that failed just now
                return None
            batch = self._batches[0]
            runs, stop, items = batch.runs, batch.pos, 0
            while stop < len(runs) and items < n:
                items += runs[stop][2]
                stop += 1
            taken = runs[batch.pos : stop]
            batch.pos = stop
            done = stop >= len(runs)
            if done:
                self._batches.popleft()
        if done:
            self._manager._released(batch.nbytes)
            self.request()
        return taken

    def _read(self) -> None:
        # Runs on the runner: the only place that touches the scan while _reading is set.
        batch: Batch | None = None
        try:
            if self._scan is None:
                scan = self._scan = self._open_scan()
                self.start, self.end, self.purge_seqno = scan.start, scan.end, scan.purge_seqno
                self.high_completed_seqno = scan.high_completed_seqno
                self.opened = True
            rows = self._scan.read(BATCH_ROWS)
            batch = self._encode(rows)
            exhausted = self._scan.exhausted
        except BaseException as exc:  # surfaced on the stream's side, where inline raises
            self._error, exhausted = exc, False
        with self._lock:
            self._reading = False
            closed = self._closed
            landed = batch is not None and bool(batch.runs) and not closed
            if landed:
                assert batch is not None
                self._batches.append(batch)
            if not closed and batch is not None:
                self.exhausted = exhausted
        if closed:
            self._close_scan()
        self._manager._read_done(batch.nbytes if landed and batch is not None else 0)
        if not closed:
            # Even inline: a read started for another stream's freed room must wake ours.
            self._notify()

    def close(self) -> None:
        """Stop reading and end the read transaction (now, or when the read in flight lands)."""
        with self._lock:
            self._closed = True
            reading = self._reading
            buffered = sum(b.nbytes for b in self._batches)
            self._batches.clear()
        self._manager._forget(self)
        if buffered:
            self._manager._released(buffered)
        if not reading:
            self._close_scan()

    def _close_scan(self) -> None:
        if self._scan is not None:
            self._scan.close()

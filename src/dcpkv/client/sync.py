"""A blocking facade over :class:`~dcpkv.client.consumer.Consumer`.

Theory of operation
-------------------
One event loop runs in a daemon thread for the facade's lifetime; every method submits a
coroutine to it (:func:`asyncio.run_coroutine_threadsafe`) and waits for the result. The
asyncio consumer keeps running between calls, so the connection's reader still answers
Noops while the application is busy with an event. :meth:`close` closes the consumer and
stops the thread.

Streaming in chunks. A thread hop per event (a future per ``next()``) costs far more than
the event itself, so :meth:`SyncConsumer.stream` runs a *pump* task in the loop thread that
iterates the async stream and appends events to a shared buffer; the caller's iterator takes
the whole buffer at once and waits only when it is empty. The pump itself fills the shared
buffer in runs (one lock per run, see :class:`_Pump`). The pump pauses when the buffer
holds ``chunk_events`` events, so the library never runs more than two chunks ahead (one in
the caller's hands, one buffered): flow-control acks, like memory, stay bounded.

What running ahead must not change:

* Offsets. The consumer streams on a private copy of the offsets; the pump copies the
  vbucket's :class:`~dcpkv.client.offsets.VbucketProgress` right after each event, and the
  caller's iterator installs that copy into :attr:`SyncConsumer.offsets` (the object the
  application gave, or the facade's own) as it hands the event over. So the public offsets
  move exactly one event at a time, as before: saved after applying an event, they resume
  right after it, never past an event the application has not seen. A change (Mutation,
  Deletion, Expiration, SeqnoAdvanced) moves its progress by one ``deliver``, which the
  caller repeats from the event's offset (``VbucketProgress.followed``) instead of taking a
  copy; in mutation-log mode repairs move progress without a delivery, so every event is
  copied there.
* Decisions. After a Rollback, a StreamEnd or a StreamRefused the pump stops until the
  caller asks for the event after it: the library's follow-up (requesting the stream again,
  a mutation-log repair) still happens only once the application has handled the event.
  A StreamEnd at the end seqno (reason OK, not resumed) has no follow-up, so it does not
  stop the pump: a stream of 1024 vbuckets to "now" was 1024 waits for the caller's thread.
* Errors raised by the stream come out of the iterator after the events before them.

Closing the iterator (or the facade) cancels the pump and closes the async stream in the
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from dcpkv.client import events
from dcpkv.client.consumer import Consumer, End, Start
from dcpkv.client.mutation_log import MutationLog
from dcpkv.client.offsets import Offsets
from dcpkv.client.settings import ClientSettings
from dcpkv.core import event_loop
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.protocol.constants import StreamEndReason

T = TypeVar("T")

# Events handed over per thread hop at most (and buffered ahead of the caller at most).
CHUNK_EVENTS = 1024


class SyncConsumer:
    """The DCP consumer of one bucket, blocking: :class:`~dcpkv.client.consumer.Consumer`'s
    constructor and methods, for code without an event loop::

        offsets = Offsets.load_or_new("app.offsets.json")
        with SyncConsumer(ClientSettings(ConnectionSettings.at(port=11210)), offsets=offsets) as c:
            for event in c.stream(end="now"):
                ...  # apply the event
            offsets.save("app.offsets.json")

    :attr:`offsets` (the object given, or the consumer's own) moves one event at a time as the
    iterator hands events over, however far ahead the library reads: saved after an event
    was applied, it resumes right after that event.
    """

    def __init__(
        self,
        config: ClientSettings,
        *,
        offsets: Offsets | None = None,
        mutation_log: MutationLog | None = None,
        chunk_events: int = CHUNK_EVENTS,
    ) -> None:
        self._loop = event_loop.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="dcpkv-client", daemon=True
        )
        self._thread.start()
        self._offsets = offsets if offsets is not None else Offsets()
        self._chunk = max(1, chunk_events)
        self._consumer = self._call(_make(config, self._offsets.copy(), mutation_log))
        self._closed = False

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._consumer.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    @property
    def consumer(self) -> Consumer:
        """The asyncio consumer underneath (use it only from the facade's loop)."""
        return self._consumer

    @property
    def offsets(self) -> Offsets:
        """Every vbucket's progress as of the last event handed over (module docstring)."""
        return self._offsets

    def vbucket_seqnos(self) -> dict[int, tuple[int, int]]:
        return self._call(self._consumer.vbucket_seqnos())

    def failover_log(self, vbucket: int) -> tuple[FailoverEntry, ...]:
        return self._call(self._consumer.failover_log(vbucket))

    def failover_logs(self, vbuckets: Iterable[int]) -> dict[int, tuple[FailoverEntry, ...]]:
        return self._call(self._consumer.failover_logs(vbuckets))

    def active_nodes(self) -> dict[int, str]:
        return self._call(self._consumer.active_nodes())

    def stream(
        self,
        vbuckets: Iterable[int] | None = None,
        *,
        start: Start = "beginning",
        end: End = "forever",
        clamp_ends: bool = False,
    ) -> Iterator[events.Event]:
        if isinstance(start, Offsets):
            self._offsets = start
        # The consumer restarts from what was handed over: a previous iterator closed early
        # may have left its private offsets ahead.
        private = self._offsets.copy()
        self._consumer.offsets = private
        if isinstance(start, Offsets):
            start = private
        copy_all = self._consumer.mutation_log is not None
        pump = _Pump(private, set(self._offsets), self._chunk, self._loop, copy_all)
        pump.agen = self._consumer.stream_chunks(
            vbuckets, start=start, end=end, clamp_ends=clamp_ends, each=pump.handed,
            most=min(FLUSH_EVENTS, self._chunk),
        )  # fmt: skip
        return self._iterate(pump)

    def _iterate(self, pump: _Pump) -> Iterator[events.Event]:
        asyncio.run_coroutine_threadsafe(pump.run(), self._loop)
        public = self._offsets
        progress_of = public.progress
        try:
            while True:
                chunk, finished, error = pump.take()
                for ev, progress in chunk:
                    if progress is None:  # a plain delivery: repeat it on the public side
                        progress_of(ev.vbucket).followed(ev.offset)
                    elif isinstance(progress, dict):  # the first event: new vbuckets' starts
                        for vb, p in progress.items():
                            public.set_progress(vb, p)
                        continue
                    else:
                        public.set_progress(ev.vbucket, progress)
                    yield ev
                if finished and not chunk:
                    if error is not None:
                        raise error
                    return
        finally:
            if not self._loop.is_closed() and self._loop.is_running():
                self._call(pump.close())


# Why the pump paused: a full buffer (resume when the caller takes it), a decision event
# (resume when the caller asks for the event after it), or that decision taken.
_FULL, _DECISION, _DECISION_TAKEN = 1, 2, 3
_DECISIONS = (events.Rollback, events.StreamEnd, events.StreamRefused)


def _is_decision(ev: events.Event) -> bool:
    """Whether the library acts on ``ev`` once the caller has it (the pump waits for that);
    a StreamEnd at the end seqno (reason OK) is the vbucket's last event: nothing follows."""
    if type(ev) is events.StreamEnd:
        return ev.will_resume or ev.reason != StreamEndReason.OK
    return isinstance(ev, _DECISIONS)


# Events whose progress is one VbucketProgress.deliver: handed over without a copy.
_DELIVERIES = frozenset({events.Mutation, events.Deletion, events.Expiration, events.SeqnoAdvanced})
# Events moved to the shared buffer at once at most (one lock and one wake-up per run).
FLUSH_EVENTS = 128
# (event, progress): a copy of its vbucket's progress after it, None for a plain delivery the
# caller repeats (VbucketProgress.followed); or (None, {vb: start}) first.
Handed = tuple[Any, Any]


class _Pump:
    """Moves events from the async stream (loop thread) to the caller (its own thread).

    The pump takes the consumer's events in lists (:meth:`Consumer.stream_chunks`: one
    async step per list, each event wrapped by :meth:`handed` right after it is made, while
    the private offsets are exactly after it), collects them in a list of the loop thread's
    own and moves them to the shared buffer (one lock, one notify) every
    :data:`FLUSH_EVENTS`, at a decision, at the end, and whenever the pump's task waits (a
    callback scheduled when the list starts: the loop runs it only once the task is
    suspended), so no event waits on the network for company. Without a mutation log every
    change is one delivery on its vbucket's progress, which the caller repeats from the
    event's offset instead of taking a copy of the progress (in mutation-log mode repairs
    move the progress without a delivery: copies throughout).
    """

    agen: AsyncGenerator[list[Handed], None]

    def __init__(
        self,
        offsets: Offsets,
        known: set[int],
        chunk: int,
        loop: asyncio.AbstractEventLoop,
        copy_all: bool = False,
    ) -> None:
        self.offsets, self.known, self.chunk, self.loop = offsets, known, chunk, loop
        self.deliveries = frozenset() if copy_all else _DELIVERIES
        self.starts: dict[int, Any] | None = None  # set at the first event
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        self.buf: list[Handed] = []
        self.local: list[Handed] = []  # the loop thread's, not yet in buf
        self.hold = 0
        self.done = False
        self.error: Exception | None = None
        self.resume: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None

    def handed(self, ev: events.Event) -> Handed:
        """What the caller gets for ``ev``, made right after it (``stream_chunks``' each)."""
        if self.starts is None:
            self.starts = self._starts(ev.vbucket)
        if type(ev) in self.deliveries:
            return (ev, None)
        return (ev, self.offsets.progress(ev.vbucket).copy())

    async def run(self) -> None:
        self.task = asyncio.current_task()
        self.resume = asyncio.Event()
        try:
            await self._pump()
        except Exception as exc:  # handed to the caller after the events before it
            self.error = exc
        finally:
            with self.lock:
                self.buf.extend(self.local)
                self.local = []
                self.done = True
                self.ready.notify()

    async def _pump(self) -> None:
        assert self.resume is not None
        local, flush_at = self.local, min(FLUSH_EVENTS, self.chunk)
        sent_starts = False
        async for handed in self.agen:
            started = bool(local)
            if not sent_starts and self.starts is not None:
                sent_starts = True
                local.append((None, self.starts))
            local.extend(handed)
            decision = _is_decision(handed[-1][0])  # a decision ends its list
            if decision or len(local) >= flush_at:
                self._flush(decision=decision)
            elif not started:
                self.loop.call_soon(self._flush)
            if self.hold:
                await self.resume.wait()

    def _starts(self, vbucket: int) -> dict[int, Any]:
        # Vbuckets the stream planned (e.g. start="now") are in the public offsets from the
        # first event on, as they were without chunks.
        return {
            vb: self.offsets.progress(vb).copy()
            for vb in self.offsets
            if vb not in self.known and vb != vbucket
        }

    def _flush(self, decision: bool = False) -> None:
        """Move the local events to the shared buffer (loop thread)."""
        if not self.local:
            return
        assert self.resume is not None
        with self.lock:
            self.buf.extend(self.local)
            self.local.clear()
            if decision:
                self.hold = _DECISION
            elif len(self.buf) >= self.chunk and not self.hold:
                self.hold = _FULL
            if self.hold:
                self.resume.clear()
            self.ready.notify()

    def _wake(self) -> None:
        self.hold = 0
        assert self.resume is not None
        self.loop.call_soon_threadsafe(self.resume.set)

    def take(self) -> tuple[list[Handed], bool, Exception | None]:
        """Everything buffered (waits while nothing is): (events, finished, error)."""
        with self.lock:
            if self.hold == _DECISION_TAKEN:  # the caller is past the decision event
                self._wake()
            while not self.buf and not self.done:
                self.ready.wait()
            chunk, self.buf = self.buf, []
            if self.hold == _FULL:
                self._wake()
            elif self.hold == _DECISION:
                self.hold = _DECISION_TAKEN
            return chunk, self.done, self.error

    async def close(self) -> None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.agen.aclose()


async def _make(
    config: ClientSettings, offsets: Offsets | None, mutation_log: MutationLog | None
) -> Consumer:
    # Built inside the loop: the consumer's asyncio objects belong to that loop.
    return Consumer(config, offsets=offsets, mutation_log=mutation_log)

"""The ready queue of a DCP producer connection: which of its streams may have something to send.

Theory of operation
-------------------
A write must not cost O(open streams): a replica or a Spark query streams all 1024 vbuckets,
and most of them are idle at any moment. As kv_engine does, a producer keeps a *ready queue*
of the streams that may have something to send and visits only those
(:meth:`dcpkv.dcp.producer.DcpProducer.next_messages`). Streams are named by their key (the
vbucket, or the vbucket and stream id: ``active_stream.stream_key``).

Two ways in:

* :meth:`ReadyQueue.wake`, on the producer's own thread (a stream opened, a takeover answer or
  a state change gave it something to do, it ended);
* :meth:`ReadyQueue.note` / :meth:`ReadyQueue.note_all`, from *any* thread (the bucket's
  seqno listener runs under a vbucket's lock on the writer's thread; a backfill batch lands
  on the worker thread). A note only appends to a deque (thread-safe in CPython);
  :meth:`ReadyQueue.drain`, on the producer's thread at the start of each pump, moves the
  notes into line.

One way out: a visit's end (:meth:`ReadyQueue.end_visit`). A stream whose visit found nothing
to send, or that is idle after it, leaves the queue; a finished one leaves it and the queue's
``forget`` (the producer's) is called with its key; otherwise its turn goes on,
up to :data:`TURN_MESSAGES` visits in a row (round-robin: a snapshot's marker and a run or two
of its items, then the next stream), and then it goes to the back of the line. A stream
waiting on the flow-control window stays queued.

Invariant: a key is in ``line`` at most once, exactly when it is in ``members``. A stream
forgotten while it waits in line is not searched for (no O(n) removal): the visit that reaches
its key finds no stream and :meth:`ReadyQueue.drop` takes it out of ``members``.

The producer's pump reads ``line`` and ``members`` as locals in its loop, once per message:
the queue is plain data plus the few moves above, not a layer between the loop and its deque.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

TURN_MESSAGES = 3  # visits per turn: a snapshot's marker and a run or two of its items


class ReadyQueue:
    """The streams that may have something to send, in turn (see the module docstring)."""

    __slots__ = ("forget", "line", "members", "notes")

    def __init__(self, forget: Callable[[int], None]) -> None:
        self.forget = forget  # called with a finished stream's key as it leaves
        self.line: deque[int] = deque()  # the keys to visit, in turn
        self.members: set[int] = set()  # exactly the keys in ``line``
        self.notes: deque[int] = deque()  # keys noted from any thread, not yet drained

    def __len__(self) -> int:
        return len(self.members)

    @property
    def has_work(self) -> bool:
        """Whether a stream may have something to send: in line, or noted since the drain."""
        return bool(self.line or self.notes)

    def wake(self, key: int) -> None:
        """Put a stream in line (the producer's thread)."""
        if key not in self.members:
            self.members.add(key)
            self.line.append(key)

    def note(self, key: int) -> None:
        """A stream has something new to send (any thread): it joins at the next drain."""
        self.notes.append(key)

    def note_all(self, keys: Iterable[int]) -> None:
        """:meth:`note` for each of ``keys`` (any thread)."""
        self.notes.extend(keys)

    def drain(self) -> None:
        """Move the notes into line (the producer's thread, before a pump)."""
        notes, members, line = self.notes, self.members, self.line
        while notes:
            key = notes.popleft()
            if key not in members:  # wake(), inlined: once per write
                members.add(key)
                line.append(key)

    def end_visit(self, key: int, idle: bool, finished: bool, turn: int) -> int:
        """Where the stream just visited (popped from the head of the line) goes: out when
        ``idle`` (nothing more until a notification) or ``finished`` (then forgotten), back to
        the head while its turn lasts, else to the back. Returns the next visit's turn count."""
        if idle or finished:
            self.members.discard(key)
            if finished:
                self.forget(key)
            return 0
        if turn < TURN_MESSAGES - 1:
            self.line.appendleft(key)  # its turn goes on (each visit passes every check)
            return turn + 1
        self.line.append(key)
        return 0

    def drop(self, key: int) -> None:
        """A key popped from the line whose stream is gone."""
        self.members.discard(key)

    def clear(self) -> None:
        self.line.clear()
        self.members.clear()
        self.notes.clear()

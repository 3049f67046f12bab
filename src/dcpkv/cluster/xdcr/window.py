"""XDCR's writes in flight, and the source progress the target has acknowledged.

Theory of operation
-------------------
The replicator reads the source while earlier batches are still being written to the target
(at most :data:`DEPTH` batches in flight). A checkpoint must never name a source position
past a change the target has not acknowledged, so the progress is tracked here, apart from
the consumer's offsets (which run ahead by whatever is in flight):

1. every event the replicator takes (a change, filtered or not, and every other event: they
   all move their vbucket's offset) is noted with the offset it leaves its vbucket at
   (:meth:`Window.took`);
2. a batch is *cut* (:meth:`Window.cut`): the offsets noted since the previous cut become
   the progress that batch acknowledges once written, and it gets a ticket; a cut with no
   change to write (everything filtered, only markers) is finished at once;
3. batches finish in any order (one node answers before another, the slow path retries
   some): :meth:`Window.done` marks a ticket finished, and :attr:`Window.acked` takes the
   progress of the oldest batches only while every one of them has finished (a prefix of
   the cuts, in cut order, so a vbucket's newer offset always overwrites its older one).

A batch that fails is never marked done: nothing at or after it is ever acknowledged (the
replicator stops; the next one resumes from the last checkpoint).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from dcpkv.client.offsets import VbucketOffset

DEPTH = 8  # batches in flight: enough to keep every target connection busy while reading


class Window:
    """See the module docstring. ``start``: the offsets the replication resumed from (they
    are acknowledged: a checkpoint said so)."""

    def __init__(self, start: Mapping[int, VbucketOffset] | None = None) -> None:
        self.acked: dict[int, VbucketOffset] = dict(start or {})
        self._taken: dict[int, VbucketOffset] = {}
        self._cuts: deque[tuple[int, dict[int, VbucketOffset]]] = deque()
        self._finished: set[int] = set()
        self._next = 0

    def took(self, vbucket: int, offset: VbucketOffset) -> None:
        """An event of ``vbucket`` was taken; it leaves the vbucket at ``offset``."""
        self._taken[vbucket] = offset

    def cut(self) -> int:
        """The batch of everything taken since the last cut: its ticket for :meth:`done`."""
        ticket = self._next
        self._next += 1
        self._cuts.append((ticket, self._taken))
        self._taken = {}
        return ticket

    def done(self, ticket: int) -> None:
        """The batch of ``ticket`` was written (every change acknowledged by the target)."""
        self._finished.add(ticket)
        cuts = self._cuts
        while cuts and cuts[0][0] in self._finished:
            oldest, offsets = cuts.popleft()
            self._finished.discard(oldest)
            self.acked.update(offsets)

    @property
    def in_flight(self) -> int:
        """Batches cut and not yet acknowledged (finished ones behind an unfinished count)."""
        return len(self._cuts)

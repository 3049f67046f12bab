"""Compaction off the batch path: a table's rewrite runs beside its batches, the swap between.

Theory of operation
-------------------
A compaction (``vtable.rewrite`` then ``vtable.swap``) rewrites the whole table: seconds of
Spark work. Run inside a batch, it made that batch and every batch queued behind it wait
(the live mirror's lag p99 was its compactions). :class:`Compactor` splits it in two:

* at a batch boundary, when the table is due (``vtable.compaction_due``) and no rewrite is
  running, it copies the committed manifest (the *snapshot*) and starts the rewrite of that
  snapshot in a thread of its own. The rewrite reads only the immutable directories the
  snapshot names, so the batches go on committing meanwhile. Its Spark jobs run in their own
  fair-scheduler pool (:data:`POOL`; ``spark_session`` switches the scheduler to FAIR), so a
  batch's tasks take the next free core instead of queueing behind the whole rewrite;
* at a later batch boundary, once the rewrite has finished, ``vtable.swap`` merges it into
  the manifest of that moment: the snapshot's directories replaced by the rewritten one,
  every directory, entry and offset committed since kept. Because the rewritten rows keep
  their (ord, pos), the later entries stay exact on them. The one case it cannot merge (a
  later batch applied a rollback as exact below the floor the rewrite used) throws the
  rewrite away (``vtable.stale_rewrite``); the next due batch starts another.

Only the batch thread commits, and a swap happens only between batches, so the table keeps
its single writer. The floors of a rewrite come from ``floors`` (for a mirror: the server's
persisted seqnos), asked in the rewrite's thread too.

Stopping (:meth:`Compactor.finish`, from the job's stop, between batches): the running
rewrite is waited for and swapped in; one that does not end in time is cancelled (its Spark
job group) and its directory deleted, so a stop leaves no half-written output. A job killed
outright leaves at most an unnamed directory, which the next swap deletes
(``vtable._delete_orphans``): the manifest never named it, so readers never saw it.

``background=False`` (a one-off ``AvailableNow`` run, whose query ends without a stop)
runs the same two steps inside the batch, one after the other, as before.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcpkv.pipelines import vtable
from dcpkv.pipelines.vtable import Manifest, Rewrite

POOL = "dcpkv-compaction"  # the rewrites' fair-scheduler pool
FINISH_WAIT_S = 300.0

log = logging.getLogger(__name__)


def no_new_floors(_manifest: Manifest) -> dict[int, int]:
    """The floors stay where they are (a view: its floors are the mirror's)."""
    return {}


@dataclass
class Compactor:
    """Compacts one table, in the background or inside the batch (module docstring)."""

    spark: Any
    table: Path
    schema: Any
    every: int | None = 10
    floors: Callable[[Manifest], dict[int, int]] = no_new_floors
    background: bool = False
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _name: str | None = field(default=None, init=False)
    _done: Rewrite | None = field(default=None, init=False, repr=False)
    _error: BaseException | None = field(default=None, init=False, repr=False)
    _group: str = field(default_factory=lambda: f"dcpkv-compact-{uuid.uuid4().hex[:8]}")
    swaps: int = field(default=0, init=False)
    dropped: int = field(default=0, init=False)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def step(self, manifest: Manifest) -> None:
        """At a batch boundary (``manifest`` just committed): swap in a finished rewrite, then
        start one if the table is due. A rewrite's failure is raised here (the batch fails,
        as it did when the compaction ran inside it)."""
        if self._thread is not None and not self._thread.is_alive():
            self._collect()
            manifest = vtable.load_manifest(self.table)
        if self._thread is not None or not vtable.compaction_due(manifest, self.every):
            return
        if not self.background:
            self._swap(self._rewrite(manifest))
            return
        self._start(manifest)

    def finish(self, timeout: float = FINISH_WAIT_S) -> None:
        """The job stops (no batch runs): wait for the running rewrite and swap it in; cancel
        one still running after ``timeout`` and delete what it wrote."""
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            self.spark.sparkContext.cancelJobGroup(self._group)
            thread.join()
            self._error = None
            self._done = None
            self._discard()
        try:
            self._collect()
        except Exception:  # stopping: a failed rewrite only costs its directory
            log.exception("the compaction of %s failed", self.table)
            self._discard()

    def _start(self, manifest: Manifest) -> None:
        from pyspark import InheritableThread

        snapshot = Manifest.from_json(manifest.to_json())
        self._name = vtable.new_data_dir(self.table, f"c{snapshot.ord:08d}")
        self._thread = InheritableThread(
            target=self._run, args=(snapshot,), name=f"compact {self.table.name}", daemon=True
        )
        self._thread.start()

    def _run(self, snapshot: Manifest) -> None:
        context = self.spark.sparkContext
        context.setLocalProperty("spark.scheduler.pool", POOL)
        context.setJobGroup(self._group, f"compaction of {self.table}", interruptOnCancel=True)
        try:
            self._done = self._rewrite(snapshot, self._name)
        except BaseException as exc:  # handed to the batch thread by _collect
            self._error = exc

    def _rewrite(self, manifest: Manifest, name: str | None = None) -> Rewrite:
        floors = self.floors(manifest)
        return vtable.rewrite(self.spark, self.table, manifest, self.schema, floors, name=name)

    def _collect(self) -> None:
        """The finished thread's outcome: its rewrite swapped in, or its error raised."""
        done, error = self._done, self._error
        self._thread, self._done, self._error = None, None, None
        if error is not None:
            self._discard()
            raise error
        self._name = None  # the swap owns the directory now (or deletes it, when stale)
        if done is not None:
            self._swap(done)

    def _discard(self) -> None:
        """Delete what the background rewrite wrote (it will not be swapped in)."""
        if self._name is not None:
            vtable.delete_dirs(self.table, [self._name])
            self._name = None

    def _swap(self, done: Rewrite) -> None:
        if vtable.swap(self.table, done) is None:
            self.dropped += 1
        else:
            self.swaps += 1

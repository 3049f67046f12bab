"""One replication at work: the source's DCP changes written to the target with their metadata.

Theory of operation
-------------------
A thin shell over the client library and the sans-I/O decisions of ``pipeline.py`` and
``checkpoints.py``:

* the source is read with the client's :class:`~dcpkv.client.consumer.Consumer` (named
  ``xdcr:<id>``): one DCP connection per source node, one stream per active vbucket to
  infinity, routed by the source's cluster map; a lost node, a failover or a rebalance on the
  source resumes the streams on the new actives from the consumer's offsets (a Rollback event
  first when history branched: the checkpoints above its point are dropped);
* the target is written with :class:`~dcpkv.client.cluster.ClusterKV`: each write to the
  active of its vbucket by the target's map, re-routed after NotMyVbucket or a lost node (a
  failover or rebalance on the target);
* start: for each vbucket the checkpoint :func:`~.checkpoints.pick_resume` chooses (source and
  target failover logs, target high seqnos), else 0;
* each chunk of events the consumer has ready (at most a batch) is filtered, batched
  (:class:`~.pipeline.Batcher`), the large documents checked with GetMeta first, and written
  all at once (every request of a batch in flight together, a node's share in one write on
  its one connection); each batch is written by its own task while the next chunk is read,
  up to :data:`~.window.DEPTH` batches in flight (so one connection per target node carries
  thousands of requests at once);
* the consumer's offsets run ahead of the target by what is in flight: the progress the
  target acknowledged is kept by :class:`~.window.Window` (a batch's offsets count once it
  and every batch cut before it are written). A Rollback event waits for the writes in
  flight, then drops the checkpoints above its point;
* every checkpoint interval (by a task of its own: an idle source too), and when the
  replicator stops (paused, deleted, failed), the acknowledged offsets of the vbuckets that
  moved are recorded with the target's uuid and high seqno (read after those writes), and
  saved through ``save`` (the manager's store). A target vbucket whose uuid changed or whose
  high seqno went down since the last look (a failover, an unclean restart: writes it
  acknowledged may be gone) fails the replicator instead, so the next one resumes from a
  checkpoint the target still holds and sends those writes again.

A failure (the target unreachable past the client's retry timeout, a refused login) ends
:meth:`Replicator.run` with the error (the writes in flight are cancelled: never
acknowledged, they are sent again at resume, and refused as identical where they landed);
the service restarts it after the restart interval, from the checkpoints. Counters use the
reference's stat names (``stats``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence

from dcpkv.client.cluster import NODE_ERRORS, ClusterKV
from dcpkv.client.consumer import Consumer
from dcpkv.client.events import Deletion, Event, Expiration, Mutation, Rollback
from dcpkv.client.offsets import Offsets, VbucketOffset, VbucketProgress
from dcpkv.client.settings import ClientSettings, ConnectionSettings, Node
from dcpkv.cluster.xdcr import pipeline
from dcpkv.cluster.xdcr.checkpoints import (
    Checkpoint,
    CheckpointLog,
    pick_resume,
    target_branch_changed,
)
from dcpkv.cluster.xdcr.spec import ReplicationConfig
from dcpkv.cluster.xdcr.window import DEPTH, Window
from dcpkv.core.conflict_resolution import ConflictMode
from dcpkv.core.deadline import within
from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status, status_name
from dcpkv.protocol import kv
from dcpkv.protocol.base import Message

log = logging.getLogger("dcpkv.xdcr")

SaveCheckpoints = Callable[[CheckpointLog], None]
_RETRY = frozenset({Status.Etmpfail, Status.Ebusy, Status.Enomem, Status.SyncWriteInProgress})
# A batch is hundreds of requests: a busy target may take seconds to answer them all. After a
# timeout the batch takes the slow path, where a write the target had applied is refused as
# identical (counted as docs_failed_cr_target instead of docs_written; the data is the same).
_BATCH_TIMEOUT_S = 15.0
_SUCCESS = int(Status.Success)
_CHANGES = (Mutation, Deletion, Expiration)
_WRITE_RETRIES = 50  # a target short of memory: ~10 s of pauses before the batch fails


class ReplicationError(DcpkvError):
    """The replication cannot go on (it is restarted after the restart interval)."""


def stat_names() -> tuple[str, ...]:
    return (
        "docs_processed", "docs_written", "docs_failed_cr_source", "docs_failed_cr_target",
        "docs_filtered", "docs_failed", "checkpoints", "deduplicated",
    )  # fmt: skip


class Replicator:
    def __init__(
        self,
        rid: str,
        source: ConnectionSettings,
        target: ConnectionSettings,
        settings: ReplicationConfig,
        checkpoints: CheckpointLog,
        save: SaveCheckpoints,
    ) -> None:
        self.id = rid
        self.source = ClientSettings(source, name=f"xdcr:{rid}", retry_timeout=60.0)
        self.target = ClientSettings(target, name=f"xdcr-target:{rid}", retry_timeout=60.0)
        self.settings = settings
        self.checkpoints = checkpoints
        self._save = save
        self.stats = dict.fromkeys(stat_names(), 0)
        self.target_mode = ConflictMode.SEQNO
        self._consumer: Consumer | None = None
        self._saved: dict[int, VbucketOffset] = {}
        self._window = Window()
        self._writes: set[asyncio.Task[None]] = set()
        # vbucket -> the target's (uuid, high seqno) when last read: a branch change is noticed
        self._target_seen: dict[int, tuple[int, int]] = {}
        self._checkpointing = asyncio.Lock()

    async def run(self) -> None:
        """Replicate until cancelled or failed (see the module docstring)."""
        async with (
            await ClusterKV.open(self.source) as source,
            await ClusterKV.open(self.target) as target,
            Consumer(self.source) as consumer,
        ):
            self._consumer = consumer
            vbuckets = _same_widths(source, target)
            self.target_mode = await _target_mode(target)
            start = await self._resume_offsets(source, target, vbuckets)
            self._window = Window({vb: start[vb] for vb in start})
            self._target_seen = await target.vbucket_seqnos()
            try:
                async with asyncio.TaskGroup() as writes:
                    writes.create_task(self._checkpoints(target))
                    await self._replicate(consumer, target, vbuckets, start, writes)
            except BaseExceptionGroup as group:  # a batch failed: the first error says why
                raise group.exceptions[0] from None
            finally:
                # Stopped, paused or failed: keep the progress the target acknowledged.
                with contextlib.suppress(Exception):
                    await within(self.checkpoint(target), 5)

    async def _replicate(
        self,
        consumer: Consumer,
        target: ClusterKV,
        vbuckets: list[int],
        start: Offsets,
        writes: asyncio.TaskGroup,
    ) -> None:
        """Read the source and cut batches, each written by its own task in ``writes``
        (at most :data:`~.window.DEPTH` at once) while the next is read."""
        batcher = pipeline.Batcher(self.settings.batch_items, self.settings.batch_kb * 1024)
        chunks = consumer.stream_chunks(
            vbuckets, start=start, each=_same, most=self.settings.batch_items
        )
        async for chunk in chunks:
            for event in chunk:
                full = self._take(event, batcher)
                if full is not None:
                    await self._cut(target, full, writes)
            await self._cut(target, batcher.take(), writes)
            last = chunk[-1]
            if isinstance(last, Rollback):  # always a chunk's last event
                async with self._checkpointing:
                    await self._drain()  # the changes above the point are written first
                    self.checkpoints.rolled_back(last.vbucket, last.rollback_seqno)
            self.stats["deduplicated"] = batcher.deduplicated

    async def _cut(
        self, target: ClusterKV, batch: list[pipeline.Change], writes: asyncio.TaskGroup
    ) -> None:
        """Send ``batch`` (its acknowledgement moves the window), once a write slot is free."""
        window = self._window
        ticket = window.cut()
        if not batch:
            window.done(ticket)
            return
        while len(self._writes) >= DEPTH:
            await asyncio.wait(self._writes, return_when=asyncio.FIRST_COMPLETED)
        task = writes.create_task(self._write(target, batch))
        self._writes.add(task)
        task.add_done_callback(functools.partial(self._written, ticket))

    def _written(self, ticket: int, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is None:
            self._window.done(ticket)

    async def _drain(self) -> None:
        while self._writes:
            await asyncio.wait(self._writes)

    async def changes_left(self) -> int:
        """Source changes not yet done (written, refused or filtered): high seqnos minus the
        acknowledged offsets."""
        consumer = self._consumer
        if consumer is None:
            return 0
        seqnos = await consumer.vbucket_seqnos()
        acked = self._window.acked
        return sum(
            max(0, high - (acked[vb].seqno if vb in acked else 0))
            for vb, (_, high) in seqnos.items()
        )

    # -- the pipeline -----------------------------------------------------------------------

    def _take(self, event: Event, batcher: pipeline.Batcher) -> list[pipeline.Change] | None:
        # (once per replicated change: a tuple isinstance, the filter asked only when set)
        self._window.took(event.vbucket, event.offset)
        if isinstance(event, _CHANGES):
            self.stats["docs_processed"] += 1
            change_filter = self.settings.filter
            if change_filter.everything or change_filter.passes(event):
                return batcher.add(event)
            self.stats["docs_filtered"] += 1
        return None

    async def _write(self, target: ClusterKV, batch: list[pipeline.Change]) -> None:
        batch = await self._winners(target, batch)
        options = pipeline.write_options(self.target_mode)
        statuses = await _quiet_writes(target, batch, options)
        again = [i for i, got in enumerate(statuses) if got is None or got in _RETRY]
        if again:  # the slow path: routed one by one, retried through failovers and moves
            redone = await asyncio.gather(*(self._send(target, batch[i]) for i in again))
            for i, got in zip(again, redone, strict=True):
                statuses[i] = got
        written = statuses.count(Status.Success)
        refused = statuses.count(Status.KeyEexists)
        self.stats["docs_written"] += written
        self.stats["docs_failed_cr_target"] += refused
        self.stats["docs_failed"] += len(statuses) - written - refused

    async def _winners(
        self, target: ClusterKV, batch: list[pipeline.Change]
    ) -> list[pipeline.Change]:
        """``batch`` without the large documents the target's metadata says would lose."""
        threshold = self.settings.optimistic_threshold
        checked = [c for c in batch if pipeline.needs_get_meta(c, threshold)]
        if not checked:
            return batch
        asks = [(c.vbucket, _get_meta_request(c)) for c in checked]
        metas = await _pipelined(target, asks)
        losers = set()
        for c, answer in zip(checked, metas, strict=True):
            meta = await _get_meta(target, c) if answer is None else _meta_of(c, answer)
            if not pipeline.would_win(self.target_mode, c, meta):
                losers.add(id(c))
        if not losers:
            return batch
        self.stats["docs_failed_cr_source"] += len(losers)
        return [c for c in batch if id(c) not in losers]

    async def _send(self, target: ClusterKV, change: pipeline.Change) -> int:
        vbucket = change.vbucket
        request = pipeline.write_request(change, self.target_mode, vbucket)
        status = int(Status.Success)
        for _ in range(_WRITE_RETRIES):
            answer = await target.call(vbucket, request)
            status = int(getattr(answer, "status", Status.Success))
            if status not in _RETRY:
                if status not in (Status.Success, Status.KeyEexists):
                    log.warning("xdcr %s: %r refused: %s", self.id, request.key,
                                status_name(status))  # fmt: skip
                return status
            await asyncio.sleep(0.2)
        raise ReplicationError(f"the target kept answering {status_name(status)}")

    # -- checkpoints ------------------------------------------------------------------------

    async def checkpoint(self, target: ClusterKV) -> None:
        """Record the acknowledged offsets that moved since the last checkpoint, with the
        target's state (read after their writes were acknowledged); fail instead when a
        target vbucket changed branch (``checkpoints.py``: it may have lost writes)."""
        async with self._checkpointing:
            acked = self._window.acked
            moved = {vb: at for vb, at in acked.items() if self._saved.get(vb) != at}
            target_seqnos = await target.vbucket_seqnos()
            changed = target_branch_changed(self._target_seen, target_seqnos)
            if changed:  # (what was seen stays: the final checkpoint as it stops fails too)
                raise ReplicationError(
                    f"the target's vbuckets {changed[:8]} changed history (a failover or an "
                    "unclean restart): resuming from the checkpoints"
                )
            self._target_seen = {**self._target_seen, **target_seqnos}
            if not moved:
                return
            for vb, at in moved.items():
                if vb not in target_seqnos:  # no active there right now: next time
                    continue
                t_uuid, t_high = target_seqnos[vb]
                cp = Checkpoint(at.vb_uuid, at.seqno, at.snap_start, at.snap_end, t_uuid, t_high)
                self.checkpoints.record(vb, cp)
                self._saved[vb] = at
            self._save(self.checkpoints)
            self.stats["checkpoints"] += 1

    async def _checkpoints(self, target: ClusterKV) -> None:
        """Every checkpoint interval, whether the source is busy or idle."""
        while True:
            await asyncio.sleep(self.settings.checkpoint_interval_s)
            await self.checkpoint(target)

    async def _resume_offsets(
        self, source: ClusterKV, target: ClusterKV, vbuckets: list[int]
    ) -> Offsets:
        offsets = Offsets()
        kept = [vb for vb in vbuckets if self.checkpoints.of(vb)]
        if not kept:
            return offsets
        source_logs = await source.failover_logs(kept)
        target_logs = await target.failover_logs(kept)
        target_seqnos = await target.vbucket_seqnos()
        for vb in kept:
            high = target_seqnos.get(vb, (0, 0))[1]
            cp = pick_resume(self.checkpoints.of(vb), source_logs[vb], target_logs[vb], high)
            if cp is None:
                continue
            at = VbucketOffset(cp.source_uuid, cp.seqno, cp.snap_start, cp.snap_end)
            offsets.set_progress(vb, VbucketProgress(at, failover_log=source_logs[vb]))
            self._saved[vb] = at
        log.info("xdcr %s: resumed %d of %d vbuckets from checkpoints", self.id,
                 len(self._saved), len(vbuckets))  # fmt: skip
        return offsets


def _same_widths(source: ClusterKV, target: ClusterKV) -> list[int]:
    """The source's vbuckets; the target must have as many (a change goes to the same
    vbucket number, whose checkpoint names the target's)."""
    source_map, target_map = source.router.map, target.router.map
    if source_map is None or target_map is None:
        raise ReplicationError("a cluster map is missing (is each side a cluster?)")
    if source_map.num_vbuckets != target_map.num_vbuckets:
        raise ReplicationError(
            f"the source has {source_map.num_vbuckets} vbuckets, the target "
            f"{target_map.num_vbuckets}: XDCR here needs the same count on both sides"
        )
    return list(range(source_map.num_vbuckets))


def _same(event: Event) -> Event:
    return event


def _status(answer: Message | None) -> int | None:
    return None if answer is None else int(getattr(answer, "status", Status.Success))


async def _pipelined(
    target: ClusterKV, requests: Sequence[tuple[int, kv.Request]]
) -> list[Message | None]:
    """Each request's answer from its vbucket's active by the target's map, every node's
    share sent in one write; None where it must take the slow path (no active in the map,
    NotMyVbucket, the node unreachable): :meth:`ClusterKV.call` routes and retries it."""
    answers: list[Message | None] = [None] * len(requests)
    by_node = _by_node(target, [vbucket for vbucket, _ in requests])

    async def on(node: Node, indexes: list[int]) -> None:
        try:
            session = await within(target.session(node), target.config.connect_timeout)
            got = await within(
                session.conn.call_many([requests[i][1] for i in indexes]),
                max(target.config.request_timeout, _BATCH_TIMEOUT_S),
            )
        except NODE_ERRORS:
            await target.drop(node)
            return
        for i, answer in zip(indexes, got, strict=True):
            if getattr(answer, "status", Status.Success) == Status.NotMyVbucket:
                target.router.offer(bytes(getattr(answer, "value", b"") or b""))
            else:
                answers[i] = answer

    await asyncio.gather(*(on(node, indexes) for node, indexes in by_node.items()))
    return answers


async def _quiet_writes(
    target: ClusterKV, batch: list[pipeline.Change], options: int | None
) -> list[int | None]:
    """Each change's status, written with a quiet with-meta write to its vbucket's active by
    the target's map, every node's share in one write ending with a Noop
    (:meth:`~dcpkv.client.connection.Connection.call_quiet`: only the failures answer).
    None where it must take the slow path (as in :func:`_pipelined`)."""
    statuses: list[int | None] = [None] * len(batch)

    async def on(node: Node, indexes: list[int]) -> None:
        try:
            session = await within(target.session(node), target.config.connect_timeout)
            conn = session.conn
            opaques = conn.next_opaques(len(indexes))
            frame = pipeline.write_frame
            frames = b"".join([frame(batch[i], options, opaques[n]) for n, i in enumerate(indexes)])
            failures = await within(
                conn.call_quiet(frames, opaques),
                max(target.config.request_timeout, _BATCH_TIMEOUT_S),
            )
        except NODE_ERRORS:
            await target.drop(node)
            return
        if not failures:  # the usual answer: every write succeeded
            for i in indexes:
                statuses[i] = _SUCCESS
            return
        for i, opaque in zip(indexes, opaques, strict=True):
            answer = failures.get(opaque)
            status = _status(answer) if answer is not None else _SUCCESS
            if status == Status.NotMyVbucket:
                target.router.offer(bytes(getattr(answer, "value", b"") or b""))
            else:
                statuses[i] = status

    by_node = _by_node(target, [c.vbucket for c in batch])
    await asyncio.gather(*(on(node, indexes) for node, indexes in by_node.items()))
    return statuses


def _by_node(target: ClusterKV, vbuckets: Sequence[int]) -> dict[Node, list[int]]:
    """The indexes of ``vbuckets`` by the node holding each active (none: left out), in
    order. (A node is hashed once per vbucket, not once per index: a frozen dataclass's
    hash is a tuple's, built anew each time.)"""
    by_node: dict[Node, list[int]] = {}
    lists: dict[int, list[int] | None] = {}
    active = target.router.active
    for vbucket in set(vbuckets):
        node = active(vbucket)
        lists[vbucket] = None if node is None else by_node.setdefault(node, [])
    for i, vbucket in enumerate(vbuckets):
        indexes = lists[vbucket]
        if indexes is not None:
            indexes.append(i)
    return by_node


def _get_meta_request(change: pipeline.Change) -> kv.GetMeta:
    return kv.GetMeta(key=change.key, vbucket=change.vbucket, version=2)


async def _get_meta(target: ClusterKV, change: pipeline.Change) -> kv.GetMetaResponse | None:
    return _meta_of(change, await target.call(change.vbucket, _get_meta_request(change)))


def _meta_of(change: pipeline.Change, answer: Message) -> kv.GetMetaResponse | None:
    if isinstance(answer, kv.GetMetaResponse):
        return answer
    status = int(getattr(answer, "status", 0))
    if status == Status.KeyEnoent:
        return None
    raise ReplicationError(f"GetMeta {change.key!r}: {status_name(status)}")


async def _target_mode(target: ClusterKV) -> ConflictMode:
    """The target bucket's conflict-resolution mode, from any node's stats."""
    node = target.router.nodes()[0] if target.router.nodes() else target.router.seeds[0]
    session = await target.session(node)
    stats = dict(await session.conn.stats())
    return ConflictMode(stats.get("ep_conflict_resolution_type", ConflictMode.SEQNO.value))

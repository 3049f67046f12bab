"""The asyncio DCP client: a thin I/O shell around the sans-I/O consumer streams.

Theory of operation
-------------------
:meth:`Consumer.stream` is one async generator. It plans one
:class:`~dcpkv.client.consumer_stream.ConsumerStream` per vbucket (start and end seqnos,
progress kept in :attr:`Consumer.offsets`), then runs a *session*: for every stream that needs
one, a stream request to the vbucket's active node (the cluster map of
:class:`~dcpkv.client.cluster.ClusterKV`), on that node's DCP connection (opened on first use:
authenticate, select the bucket, DcpOpen as a producer, Controls for flow control and noops;
``dcp_links.py`` holds one per node), and every pushed message fed to its stream, yielding the
events it returns. A node whose connection breaks or goes silent is dropped: its streams are
told :meth:`~ConsumerStream.disconnected` and asked again, after a pause and a map refresh, on
whatever node the map then names, from their offsets; the other nodes' streams go on. A
stream that ends with StateChanged or is refused NotMyVbucket (the vbucket moved, or is
failing over) is asked again the same way. Anything else that breaks the session ends it for
every stream; the next one starts after a capped, jittered exponential backoff. The
generator returns once every vbucket reached its end seqno (StreamEnd OK); any other stream
end is asked again from the offset. A single node is a cluster whose map names it for every
vbucket: one connection, as before.

Everything that decides *what* to do lives in the sans-I/O core (each stream's state machine
in ``consumer_stream.py``; message routing, re-requests, the refusal retry schedule and the
reconnect backoff in ``session_policy.py``); this module only decides *when*:

* Events are produced one message at a time, only when the application pulls the next event,
  so :attr:`Consumer.offsets` never runs ahead of what the application was given, and a
  BufferAck for a message goes out only once its events were handed over (flow control
  paces the producer to the application, not to the socket). The session hands them over in
  runs: a plain generator per received batch makes each event as it is pulled and stops at a
  decision (Rollback, StreamEnd, StreamRefused, StreamStart), whose follow-up is asynchronous;
  so a change costs one async generator step. Changes come from the receive path as runs of
  field tuples (``connection.py``), each made into its event by
  :meth:`~ConsumerStream.change` as it is pulled; a run's BufferAck bytes are told to the
  links once the whole run was handed over, and the links hear of them once per ack threshold
  (``PendingAcks``).
* A Rollback event is yielded *before* the stream is requested again: the application rolls
  back when it receives the event, and the request goes out when it pulls the next one.
* Noops are answered by the connection's reader task (``connection.py``), independently of
  the application's pace; two silent noop intervals end the session.

Mutation-log mode (``mutation_log=``, spec 002). Keys are logged (one commit per received
batch) before any of their events is yielded. Every stream request is preceded by
GetFailoverLog and :meth:`~ConsumerStream.check_failover_log` (mandatory in this mode, see
``consumer_stream.py``). On a rollback to R the application sees, in this order:

1. the :class:`~dcpkv.client.events.Rollback` event (``rollback_seqno`` R);
2. if the log covers R, one *repair event* per key logged above R (oldest change first): a
   :class:`~dcpkv.client.events.Mutation` with the document's current value when it exists,
   else a :class:`~dcpkv.client.events.Deletion`. KV Get returns no seqno, so a repair event
   carries ``seqno`` = the vbucket's high seqno read after the Gets (an upper bound),
   ``rev_seqno`` 0 and ``offset`` = the rolled-back offset. Apply it unconditionally (it is
   newer than anything the stream will re-deliver before reaching it again);
3. if the log does not cover R: a second Rollback event with ``rollback_seqno`` 0, the full
   resync: drop every document of the vbucket; the stream restarts from 0;
4. then the stream resumes from R (or 0) and converges on the producer's history.

The log entries above R are replaced by the re-fetched keys only after the last repair event
was pulled, so a crash mid-repair leaves them in place: a new :meth:`stream` re-fetches every
key logged above a vbucket's saved offset before requesting it.

Clamped ends (``stream(..., clamp_ends=True)``). An explicit end seqno is a promise only on the
branch it was read from: after an unclean restart or a failover the new branch may stop below
it, and a producer keeps a stream open until its end seqno arrives, which may be never. With
``clamp_ends`` every stream request (the first one and every re-request after a rollback, a
lost connection or a resumable StreamEnd) first lowers the vbucket's end to its high seqno at
that moment (Stat ``vbucket-seqno``, read after the DCP connection was opened, so a restart
after the read also kills that connection and forces a new request and a new read). On an
unchanged branch the high seqno never drops below an end that was read from it, so the clamp
changes nothing; it bites only when history was cut below the end. The caller learns that the
stream ended early from the offsets (below the end it asked for, usually on a new uuid).

Without a mutation log, stream requests are sent without the failover-log round trip: the
producer's own check answers Rollback when needed, which costs the same two round trips as
GetFailoverLog-then-request, and nothing when no rollback is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Literal, TypeVar

from dcpkv.client import events
from dcpkv.client.cluster import ClusterKV
from dcpkv.client.connection import AuthError, ClientError, Connection, Pushed, authenticate
from dcpkv.client.consumer_stream import ConsumerState, ConsumerStream
from dcpkv.client.dcp_links import DcpLinks, PendingAcks, Received
from dcpkv.client.flow_control import Liveness
from dcpkv.client.kv import Document
from dcpkv.client.mutation_log import MutationLog
from dcpkv.client.offsets import Offsets, VbucketOffset, VbucketProgress
from dcpkv.client.session_policy import DONE, Backoff, StreamRun
from dcpkv.client.settings import ClientSettings, Node
from dcpkv.core.deadline import within
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.seqno import U64_MAX
from dcpkv.protocol import dcp, kv
from dcpkv.protocol.constants import HelloFeature, OpenFlag
from dcpkv.protocol.errors import CodecError

log = logging.getLogger("dcpkv.client")

Start = Literal["beginning", "now"] | Offsets
End = Literal["forever", "now"] | Mapping[int, int]
T = TypeVar("T")

# Events after which the library acts (requests again, repairs, fails): everything else is
# handed over and forgotten.
_FOLLOWED = (events.Rollback, events.StreamRefused, events.StreamEnd, events.StreamStart)
_ITEMS = (dcp.Mutation, dcp.Deletion, dcp.DeletionV2, dcp.Expiration)
# Snappy: values the bucket keeps compressed come as they are (less to send), inflated on receipt
_HELLO = (HelloFeature.Datatype, HelloFeature.JSON, HelloFeature.Snappy)
# Connection-level failures: the session ends and the streams resume on a new connection.
_SESSION_ERRORS = (ConnectionError, OSError, TimeoutError, CodecError)
# A node's connection failed (to open or mid-stream): only that node's streams move.
_NODE_ERRORS = (ConnectionError, OSError, TimeoutError)


class StreamFailedError(ClientError):
    """A vbucket's stream failed for good: refused with a final status, or LostPrivileges."""


class Consumer:
    """The asyncio DCP consumer of one bucket (:class:`SyncConsumer` is its blocking facade).

    ``async for event in consumer.stream(...)`` yields one event per change or decision
    (``dcpkv.client.events``), for every vbucket of the bucket, from every node of a cluster.
    :attr:`offsets` moves only as events are handed over: saved after the application applied
    an event, it resumes right after it (``stream(start=offsets)``). A lost connection, a
    restarted node or a moved vbucket is resumed by the library from the offsets; when history
    branched it yields a :class:`~dcpkv.client.events.Rollback` first, and the application
    undoes its changes above ``rollback_seqno``. With a ``mutation_log``
    (:class:`~dcpkv.client.mutation_log.MutationLog`) the library does that undoing for it:
    after the Rollback come the current versions of the keys it must undo. The module
    docstring gives the details.
    """

    def __init__(
        self,
        config: ClientSettings,
        *,
        offsets: Offsets | None = None,
        mutation_log: MutationLog | None = None,
    ) -> None:
        self.config = config
        self._offsets = offsets if offsets is not None else Offsets()
        self._mlog = mutation_log
        self._kv: ClusterKV | None = None
        self._links: set[DcpLinks] = set()
        self._stale_map = False  # a stream was refused or moved: refresh before routing
        self._closed = False
        self._rng = random.Random()
        # What happened so far (for tests, progress displays and logs).
        self.counters = {"sessions": 0, "rollbacks": 0, "full_resyncs": 0, "repaired_keys": 0}

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        for links in list(self._links):
            await links.close()
        self._links.clear()
        if self._kv is not None:
            await self._kv.close()
            self._kv = None

    @property
    def mutation_log(self) -> MutationLog | None:
        return self._mlog

    @property
    def offsets(self) -> Offsets:
        """Every vbucket's progress; moves only as events are handed to the application."""
        return self._offsets

    @offsets.setter
    def offsets(self, offsets: Offsets) -> None:
        """Replace every vbucket's progress (between streams)."""
        self._offsets = offsets

    # -- key-value questions ----------------------------------------------------------------

    async def vbucket_seqnos(self) -> dict[int, tuple[int, int]]:
        """vbucket -> (vbucket uuid, high seqno), from Stat ``vbucket-seqno``."""
        return await (await self._kv_session()).vbucket_seqnos()

    async def failover_log(self, vbucket: int) -> tuple[FailoverEntry, ...]:
        """The producer's failover log of ``vbucket``, newest entry first."""
        return await (await self._kv_session()).failover_log(vbucket)

    async def failover_logs(self, vbuckets: Iterable[int]) -> dict[int, tuple[FailoverEntry, ...]]:
        """:meth:`failover_log` of every vbucket of ``vbuckets``, asked all at once."""
        return await (await self._kv_session()).failover_logs(vbuckets)

    async def active_nodes(self) -> dict[int, str]:
        """vbucket -> ``host:port`` of its active node, as the cluster map says now."""
        kv = await self._kv_session()
        await kv.refresh_once()
        m = kv.router.map
        if m is None:
            return {}
        return {vb: node for vb in range(m.num_vbuckets) if (node := m.active(vb)) is not None}

    async def _kv_session(self) -> ClusterKV:
        """The cluster's KV client (bootstrapped on first use): map, routing, retries."""
        if self._closed:
            raise ClientError("the consumer is closed")
        if self._kv is None:
            self._kv = await ClusterKV.open(self.config)
        return self._kv

    async def _route(self, vbucket: int) -> Node | None:
        """The node holding ``vbucket`` active (None: nobody right now), after a map refresh
        when a stream was refused, moved or lost its node since the last one."""
        kv = await self._kv_session()
        if self._stale_map:
            self._stale_map = False
            await kv.refresh_once()
        return kv.router.active(vbucket)

    # -- streaming --------------------------------------------------------------------------

    def stream(
        self,
        vbuckets: Iterable[int] | None = None,
        *,
        start: Start = "beginning",
        end: End = "forever",
        clamp_ends: bool = False,
    ) -> AsyncGenerator[events.Event, None]:
        """Stream ``vbuckets`` (default: all of the bucket, or the keys of an ``end`` mapping).

        ``start``: "beginning" streams vbuckets the consumer's offsets do not hold from 0 and
        resumes the others; "now" starts the new ones at their current high seqno; an
        :class:`Offsets` replaces the consumer's offsets and resumes from them. ``end``:
        "forever"; "now", each vbucket's high seqno when the stream starts; or a mapping of
        explicit end seqnos. ``clamp_ends``: lower each end to the vbucket's high seqno before
        every stream request, so a stream whose branch was cut below its end still ends (see
        the module docstring).
        """
        if isinstance(start, Offsets):
            self._offsets = start
        vbs = None if vbuckets is None else sorted(set(vbuckets))
        return self._stream(vbs, start, end, clamp_ends)

    def stream_chunks(
        self,
        vbuckets: Iterable[int] | None = None,
        *,
        start: Start = "beginning",
        end: End = "forever",
        clamp_ends: bool = False,
        each: Callable[[events.Event], T],
        most: int = 128,
    ) -> AsyncGenerator[list[T], None]:
        """:meth:`stream`'s events as ``each(event)``, in lists of at most ``most``, for a
        caller that hands them on in bulk (the blocking facade, ``dcpkv stream``): one async
        step per list instead of one per event. Each list is made when it is asked for, so
        :attr:`offsets` run ahead of the caller by up to one list (at a list's end they are
        exactly after its last event); ``each(event)`` is called right after each event is
        made, while the offsets are exactly after it (the facade copies a progress there). A
        decision event (Rollback, StreamEnd, StreamRefused, StreamStart) always ends its list,
        and what follows it (a request, a repair) happens only when the next list is asked
        for. An error raised while a list is made comes after the events made before it.
        """
        if isinstance(start, Offsets):
            self._offsets = start
        vbs = None if vbuckets is None else sorted(set(vbuckets))
        return self._chunks(vbs, start, end, clamp_ends, max(1, most), each)

    async def _stream(
        self, vbuckets: list[int] | None, start: Start, end: End, clamp: bool = False
    ) -> AsyncGenerator[events.Event, None]:
        run, backoff = await self._start_run(vbuckets, start, end, clamp)
        while not run.finished and not self._closed:
            async with self._session_scope(run, backoff) as links:
                # The session hands over runs of events made one at a time as they are
                # pulled (a sync generator per batch): one async layer per event, not two.
                async for events_run in self._session(links, run):
                    for ev in events_run:
                        yield ev

    async def _chunks(
        self,
        vbuckets: list[int] | None,
        start: Start,
        end: End,
        clamp: bool,
        most: int,
        each: Callable[[events.Event], T],
    ) -> AsyncGenerator[list[T], None]:
        """:meth:`_stream` in lists: see :meth:`stream_chunks`."""
        run, backoff = await self._start_run(vbuckets, start, end, clamp)
        while not run.finished and not self._closed:
            async with self._session_scope(run, backoff) as links:
                async for events_run in self._session(links, run):
                    made = iter(events_run)
                    while True:
                        chunk, error = _take(made, most, each)
                        if chunk:
                            yield chunk
                        if error is not None:
                            raise error  # in the session scope, as from :meth:`_stream`
                        if len(chunk) < most:
                            break

    async def _start_run(
        self, vbuckets: list[int] | None, start: Start, end: End, clamp: bool
    ) -> tuple[StreamRun, Backoff]:
        run = StreamRun(await self._plan(vbuckets, start, end), clamp=clamp)
        if self._mlog is not None:
            run.owed.update(self._owed_at_start(run))
        return run, Backoff(self.config.max_backoff, rng=self._rng)

    @contextlib.asynccontextmanager
    async def _session_scope(self, run: StreamRun, backoff: Backoff) -> AsyncIterator[DcpLinks]:
        """One session's links. A connection-level failure ends the session quietly (the
        streams resume on the next one, after a pause), anything else goes to the
        application."""
        links = DcpLinks(self._open_dcp, self.config.buffer_size)
        self._links.add(links)
        try:
            yield links
        except AuthError:
            raise
        except _SESSION_ERRORS as exc:
            log.warning("DCP session ended: %s", exc or type(exc).__name__)
        finally:
            self._links.discard(links)
            await links.close()
            run.session_ended()
        if not run.finished and not self._closed:
            await asyncio.sleep(backoff.next_delay())

    async def _plan(
        self, vbuckets: list[int] | None, start: Start, end: End
    ) -> dict[int, ConsumerStream]:
        wants_all = vbuckets is None and not isinstance(end, Mapping)
        need_seqnos = wants_all or start == "now" or end == "now"
        seqnos = await self.vbucket_seqnos() if need_seqnos else {}
        if vbuckets is None:
            vbuckets = sorted(end) if isinstance(end, Mapping) else sorted(seqnos)
        streams = {}
        for vb in vbuckets:
            if need_seqnos and vb not in seqnos:
                raise ClientError(f"the bucket has no vbucket {vb}")
            if start == "now" and vb not in self._offsets:
                uuid, high = seqnos[vb]
                self._offsets.set_progress(vb, VbucketProgress(VbucketOffset.at(high, uuid)))
            streams[vb] = ConsumerStream(
                vb, self._offsets.progress(vb), end_seqno=_end_seqno(vb, end, seqnos)
            )
        return streams

    def _owed_at_start(self, run: StreamRun) -> set[int]:
        """Vbuckets whose mutation log holds changes above the offset, or lost some: a
        previous run may have applied them (or crashed in a repair), so repair them first."""
        assert self._mlog is not None
        owed = set()
        for vb, cs in run.streams.items():
            seqno = cs.offset.seqno
            if self._mlog.keys_above(vb, seqno) or not self._mlog.covers(vb, seqno):
                owed.add(vb)
        return owed

    # -- one connection -----------------------------------------------------------------------

    async def _open_dcp(
        self, node: Node, opaques: Iterator[int], wake: asyncio.Event
    ) -> Connection:
        """A DCP connection to ``node``, part of a session's :class:`DcpLinks`."""
        cfg = self.config
        conn = await Connection.open(
            node.host, node.port, cfg.connect_timeout, cfg.connection.tls,
            opaques=opaques, wake=wake,
        )  # fmt: skip
        try:
            await within(self._handshake(conn), cfg.connect_timeout)
        except BaseException:
            await conn.close()
            raise
        self.counters["sessions"] += 1
        return conn

    async def _handshake(self, conn: Connection) -> None:
        cfg = self.config
        c = cfg.connection
        await conn.call_ok(kv.Hello(agent=cfg.name, features=_HELLO))  # Snappy: see _item
        await authenticate(conn, c.user, c.password, c.bucket)
        # IncludeDeleteTimes: the layout an Expiration needs (and deletions carry their time)
        flags = OpenFlag.Producer | OpenFlag.IncludeDeleteTimes
        flags |= OpenFlag(0) if cfg.include_values else OpenFlag.NoValue
        await conn.call_ok(dcp.DcpOpen(name=cfg.name, flags=flags))
        if cfg.buffer_size:
            await conn.call_ok(
                dcp.DcpControl(key="connection_buffer_size", value=str(cfg.buffer_size))
            )
        # Expirations as their own opcode, when the producer knows the control (else they
        # arrive as deletions, which is still correct).
        await conn.call(dcp.DcpControl(key="enable_expiry_opcode", value="true"))
        if cfg.compression:
            await conn.call_ok(dcp.DcpControl(key="force_value_compression", value="true"))
        if cfg.include_prepares:
            await conn.call_ok(dcp.DcpControl(key="enable_sync_writes", value="true"))
        await conn.call_ok(dcp.DcpControl(key="enable_noop", value="true"))
        await conn.call_ok(dcp.DcpControl(key="set_noop_interval", value=f"{cfg.noop_interval:g}"))
        conn.liveness = Liveness(cfg.noop_interval, asyncio.get_running_loop().time())

    async def _session(
        self, links: DcpLinks, run: StreamRun
    ) -> AsyncIterator[Iterable[events.Event]]:
        loop = asyncio.get_running_loop()
        async for ev in self._session_start(links, run):
            yield (ev,)
        acks = PendingAcks(links)
        while not run.finished:
            batch, lost = links.take()
            if not batch and not lost:
                await links.wait(run.retry_timeout(loop.time()))
            for node in lost:
                await self._node_lost(links, run, node, "connection ended")
            if self._mlog is not None:
                self._log_keys(run, [(nbytes, msg) for _node, nbytes, msg in batch])
            async for events_run in self._batch(links, run, acks, batch):
                yield events_run
            for cs in run.due_retries(loop.time()):
                async for ev in self._request(links, run, cs):
                    yield (ev,)

    async def _batch(
        self, links: DcpLinks, run: StreamRun, acks: PendingAcks, batch: list[Received]
    ) -> AsyncIterator[Iterable[events.Event]]:
        """A batch's events: runs of changes, broken by decisions and what follows them."""
        messages = iter(batch)
        decided: list[tuple[ConsumerStream, events.Event]] = []
        while True:
            yield self._changes(run, acks, messages, decided)
            if not decided:
                break
            cs, ev = decided.pop()  # a decision: what follows it, then a request
            async for follow in self._follow(links, run, cs, ev):
                yield (follow,)
        acks.flush()

    @staticmethod
    def _changes(
        run: StreamRun,
        acks: PendingAcks,
        messages: Iterator[Received],
        decided: list[tuple[ConsumerStream, events.Event]],
    ) -> Iterator[events.Event]:
        """The events of ``messages``, each made only when pulled (the offsets never run
        ahead of the application) and acked once taken, up to and including the first
        decision event, which is left in ``decided`` for the library to act on."""
        route = run.route
        for node, nbytes, msg in messages:
            if isinstance(msg, list):  # a run of plain mutations (fields): the hot path
                run_bytes, last_vb, cs = 0, -1, None
                for fields in msg:
                    if fields[1] != last_vb:  # a vbucket's changes come a few in a row
                        last_vb = fields[1]
                        cs = route(last_vb, node)
                    if cs is not None:
                        yield cs.change(fields)
                    run_bytes += fields[0]
                acks.add(node, run_bytes)  # once the whole run was handed over
                continue
            cs = run.stream_for(msg, node)
            ev = None if cs is None else cs.event_for(msg)
            if ev is not None:
                yield ev
            if nbytes:
                acks.add(node, nbytes)
            if isinstance(ev, _FOLLOWED):
                assert cs is not None
                acks.flush()
                decided.append((cs, ev))
                return

    async def _follow(
        self, links: DcpLinks, run: StreamRun, cs: ConsumerStream, ev: events.Event
    ) -> AsyncIterator[events.Event]:
        """What follows a decision event, once the application pulled the next one, and the
        stream's next request when it ended or was refused."""
        async for follow in self._after(run, cs, ev, asyncio.get_running_loop().time()):
            yield follow
        if run.wants_request(cs):
            async for follow in self._request(links, run, cs):
                yield follow

    async def _node_lost(self, links: DcpLinks, run: StreamRun, node: Node, why: object) -> None:
        """``node``'s connection is gone: its streams resume (from their offsets) wherever the
        refreshed map puts them, after a pause; the other nodes' streams go on."""
        vbs = run.node_lost(node, asyncio.get_running_loop().time(), self.config.max_backoff)
        log.warning("DCP connection to %s lost (%s): %d streams resume", node, why, len(vbs))
        await links.drop(node)
        self._stale_map = True

    async def _session_start(self, links: DcpLinks, run: StreamRun) -> AsyncIterator[events.Event]:
        """Owed repairs first, then every stream's request, each on its active's connection."""
        for vb in sorted(run.owed):
            async for ev in self._repair(run, run.streams[vb]):
                yield ev
        if run.reads_highs_at_once():
            run.highs = {vb: high for vb, (_uuid, high) in (await self.vbucket_seqnos()).items()}
        for cs in run.first_requests():
            async for ev in self._request(links, run, cs):
                yield ev

    async def _after(
        self, run: StreamRun, cs: ConsumerStream, ev: events.Event, now: float
    ) -> AsyncIterator[events.Event]:
        """What follows an event, once the application pulled the next one."""
        if isinstance(ev, events.Rollback):
            async for follow in self._rolled_back(run, cs):
                yield follow
        elif isinstance(ev, events.StreamRefused):
            if not ev.will_retry:
                raise StreamFailedError(f"vbucket {ev.vbucket}: stream refused", ev.status)
            # NotMyVbucket, Etmpfail...: ask again later, on the node a fresh map names.
            run.refused(cs.vbucket, now, self.config.max_backoff)
            self._stale_map = True
        elif isinstance(ev, events.StreamEnd) and cs.state is ConsumerState.FAILED:
            raise StreamFailedError(f"vbucket {ev.vbucket}: stream ended ({ev.reason})")
        elif isinstance(ev, events.StreamEnd) and ev.will_resume:
            self._stale_map = True  # StateChanged: the vbucket moved (or is about to)
        elif isinstance(ev, events.StreamStart):
            run.started(cs.vbucket)

    async def _request(
        self, links: DcpLinks, run: StreamRun, cs: ConsumerStream
    ) -> AsyncIterator[events.Event]:
        """Send the stream request to the vbucket's active; in mutation-log mode compare
        failover logs first. No active, or no connection to it: ask again after a pause.

        After a local rollback the request goes out without a second comparison: the repair
        raised ``seen`` above the rollback point on purpose, so comparing again would roll
        back again. The producer still checks the request itself.
        """
        now = asyncio.get_running_loop().time()
        node = await self._route(cs.vbucket)
        if node is None:
            run.refused(cs.vbucket, now, self.config.max_backoff)
            self._stale_map = True
            return
        try:
            conn = await links.get(node)
            if self._mlog is not None:
                answer = await conn.call(dcp.GetFailoverLog(vbucket=cs.vbucket))
                if isinstance(answer, dcp.GetFailoverLogResponse):
                    ev = cs.check_failover_log(answer.failover_log)
                    if ev is not None:
                        yield ev
                        async for follow in self._rolled_back(run, cs):
                            yield follow
            if run.clamp and cs.end_seqno != U64_MAX:
                await self._clamp_end(run, cs)
            opaque = conn.next_opaque()
            run.requested(cs.vbucket, opaque, links.same_node(node))
            conn.send(cs.request(opaque=opaque))
        except AuthError:
            raise
        except _NODE_ERRORS as exc:
            await self._node_lost(links, run, node, exc or type(exc).__name__)
            if cs.needs_request and cs.vbucket not in run.retry_at:
                run.refused(cs.vbucket, now, self.config.max_backoff)

    async def _clamp_end(self, run: StreamRun, cs: ConsumerStream) -> None:
        high = run.highs.pop(cs.vbucket, None)
        if high is None:
            kv = await self._kv_session()
            high = (await kv.vbucket_seqnos(cs.vbucket))[cs.vbucket][1]
        if high < cs.end_seqno:
            log.info("vbucket %d: end %d clamped to high seqno %d", cs.vbucket, cs.end_seqno, high)
            cs.end_seqno = high

    # -- rollbacks and the mutation log -----------------------------------------------------

    async def _rolled_back(self, run: StreamRun, cs: ConsumerStream) -> AsyncIterator[events.Event]:
        self.counters["rollbacks"] += 1
        if self._mlog is None:
            return
        run.owed.add(cs.vbucket)
        async for ev in self._repair(run, cs):
            yield ev

    def _log_keys(self, run: StreamRun, batch: list[Pushed]) -> None:
        assert self._mlog is not None
        entries: list[tuple[int, int, bytes]] = []
        for _, msg in batch:
            if isinstance(msg, list):  # a run of mutations' fields (connection.py)
                entries.extend((f[1], f[4], f[2]) for f in msg if f[1] in run.streams)
            elif isinstance(msg, _ITEMS) and msg.vbucket in run.streams:
                entries.append((msg.vbucket, msg.by_seqno, bytes(msg.key)))
        if entries:
            self._mlog.record_many(entries)

    async def _repair(self, run: StreamRun, cs: ConsumerStream) -> AsyncIterator[events.Event]:
        """Spec 002's repair of one vbucket at its (rolled-back) offset: module docstring."""
        assert self._mlog is not None
        vb, point = cs.vbucket, cs.offset.seqno
        if cs.state in DONE:
            run.owed.discard(vb)
            return
        plan = self._mlog.repair_plan(vb, point)
        if plan.full_resync:
            self.counters["full_resyncs"] += 1
            yield cs.roll_back(0)
            self._mlog.truncate_above(vb, 0)
            run.owed.discard(vb)
            return
        keys = list(plan.refetch_keys)
        high = point
        if keys:
            kv = await self._kv_session()
            docs = await kv.get_many(vb, keys)
            # Read after the Gets: an upper bound of every fetched document's seqno.
            high = max(point, (await kv.vbucket_seqnos(vb))[vb][1])
            cs.note_seen(high)
            self.counters["repaired_keys"] += len(keys)
            for key, doc in zip(keys, docs, strict=True):
                yield _repair_event(vb, key, doc, high, cs.offset)
        self._mlog.repaired(vb, point, [(key, high) for key in keys])
        run.owed.discard(vb)


def _take(
    made: Iterator[events.Event], most: int, each: Callable[[events.Event], T]
) -> tuple[list[T], Exception | None]:
    """Up to ``most`` events of ``made`` through ``each``, and the error that stopped them:
    the events made before an error must still reach the caller (their offsets moved)."""
    chunk: list[T] = []
    try:
        for ev in itertools.islice(made, most):
            chunk.append(each(ev))
    except Exception as exc:
        return chunk, exc
    return chunk, None


def _end_seqno(vb: int, end: End, seqnos: Mapping[int, tuple[int, int]]) -> int:
    if end == "forever":
        return U64_MAX
    if end == "now":
        return seqnos[vb][1]
    assert isinstance(end, Mapping)
    if vb not in end:
        raise ValueError(f"no end seqno for vbucket {vb}")
    return end[vb]


def _repair_event(
    vb: int, key: bytes, doc: Document | None, seqno: int, offset: VbucketOffset
) -> events.Mutation | events.Deletion:
    if doc is None:
        return events.Deletion(vb, key, seqno, 0, 0, offset)
    return events.Mutation(
        vb, key, doc.value, seqno, 0, doc.flags, 0, doc.cas, doc.datatype, offset
    )

"""Replication inside a data node: every replica vbucket streams from its active node over DCP.

Theory of operation
-------------------
A :class:`Replicator` per bucket reconciles the node's replica vbuckets with the cluster map the
manager pushed (SetClusterConfig): for every vbucket this node holds as replica, the map's
``vBucketMap[vb][0]`` names the active node in ``serverList``; vbuckets are grouped by that
source, and each source gets one :class:`ReplicationLink` (one DCP connection per source node
and bucket, spec 002). It runs again whenever a map is pushed or a vbucket changes state
(debounced: one reconcile per loop iteration), so streams follow the map: a vbucket whose
active moved is re-requested from the new one; one no longer held as replica is closed.

Rebalance (spec 002, "How ns_server performs a partition rebalance") is map-driven the same
way: the manager tells this node to take a vbucket over by setting it *pending* (SetVbucket),
and the map still names the current active. A pending vbucket is streamed from that active like
a replica, but with the TakeOver flag (:mod:`~dcpkv.dcp.passive_stream`): once caught up, the
active hands it over (its copy dead, ours active, the failover log kept). The manager watches
the states and then moves the map; no new opcode is needed. A pending copy finishes its
takeover whether or not the manager still runs: a restarted manager finds it active and puts
it in the map (:mod:`dcpkv.cluster.rebalance`). The map this follows is the one the manager
pushed for good, never a staged one served for a handover (:mod:`dcpkv.server.handover`).

A link is a thin asyncio shell around the sans-I/O :class:`~dcpkv.dcp.consumer.DcpConsumer`:
connect, log in as the node's admin (SASL PLAIN), select the bucket, write the consumer's
opening, then feed it every frame read and write what it answers. A rollback the producer
asks for runs ``Bucket.rollback`` on the server's disk thread (the flusher's: the two never
interleave), and the stream asks again from where the vbucket then stands. A lost or refused
connection is retried with backoff (50 ms doubling to 2 s); a stream refused by the source
(its state not set yet, a map that lags) asks again after a pause.

With the cluster's ``repairOnRollback`` setting on (in the pushed config's ``dcpkv``
section), a rollback first offers the new active what only this replica has above the
rollback point (:mod:`dcpkv.dcp.repair` decides per document; a short-lived KV connection to
the source asks GetMeta and writes). The repair is an offer, never a condition: when it fails
or times out the rollback goes on.

SyncWrites: the link's DCP connection enables them and names itself with the node's name
(``host:port``, as the active's topology names it), so prepares, commits and aborts are applied
here and the replica acknowledges its high prepared seqno (DcpSeqnoAcknowledged): at a
snapshot's end from the loop, or, for a PersistToMajority prepare, once the flusher persisted
it (the bucket's ``seqno_ack_listeners`` wake the link from the flusher thread).

Front-end writes to a replica are refused by the KV handlers (NotMyVbucket); what arrives
here is applied with the active's seqnos, CAS and rev seqnos, and persisted by the ordinary
flusher, one snapshot at a time.

Full eviction: a replica's write of a key its table does not hold, while the table counts
non-resident items, needs storage's version first (the item count, the entry it replaces).
The engine raises WouldBlock for it, as for a client's request, rather than reading on the
loop; the link then *parks*: it keeps the message and the parser's iterator, reads no more
from the socket, and asks the bucket's fetcher for the key and for the keys of the DCP writes
the parser holds behind it (``PREFETCH_FRAMES``, one batch). When the read lands (on the
loop, while its result is ready) the message is applied again, then what follows; the
session reads again once everything buffered is applied. Order is kept: a vbucket's writes
are applied in seqno order, and the source's flow control sees the bytes acknowledged only
once applied. A session that ends meanwhile drops what was parked: the next one asks each
stream from where its vbucket stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial

from dcpkv.core import logs
from dcpkv.core.deadline import within
from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.consumer import DcpConsumer, RollbackOrder
from dcpkv.dcp.repair import Meta, RepairKind, RepairWrite, decide, worth_asking
from dcpkv.engine.bg_fetch import WouldBlock
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.item import Item
from dcpkv.protocol import kv
from dcpkv.protocol.constants import HelloFeature, Magic, Opcode
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import Frame, FrameParser, encode_frame
from dcpkv.protocol.messages import decode_message
from dcpkv.server.fast_path import pipelined_keys

log = logging.getLogger("dcpkv.replication")

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 2.0
TICK_S = 0.1  # how often a link looks for streams due to ask again
READ_CHUNK = 1 << 20
_REPAIR_FEATURES = (
    HelloFeature.Datatype, HelloFeature.Xattr, HelloFeature.Snappy, HelloFeature.JSON,
)  # fmt: skip
REPAIR_TIMEOUT_S = 30.0  # a repair longer than this gives up; the rollback goes on
PREFETCH_FRAMES = 1024  # DCP writes behind a parked one looked at for their keys
_DCP_WRITES = frozenset(
    int(op) for op in (Opcode.DcpMutation, Opcode.DcpDeletion, Opcode.DcpExpiration,
                       Opcode.DcpCommit)
)  # fmt: skip
# replicas follow their active; a pending copy is fed by a takeover stream from it
_FED = (VBucketState.REPLICA, VBucketState.PENDING)


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    password: str


def repair_on_rollback(config: bytes | None) -> bool:
    """The cluster's setting, from the pushed config (off when absent)."""
    if config is None:
        return False
    section = json.loads(config).get("dcpkv", {})
    return isinstance(section, dict) and section.get("repairOnRollback") is True


def replica_sources(config: bytes | None, bucket: Bucket, me: str) -> dict[str, set[int]]:
    """Source node ("host:port") -> the replica and pending vbuckets of ``bucket`` it is
    active for."""
    if config is None:
        return {}
    vbmap = json.loads(config).get("vBucketServerMap", {})
    servers, rows = vbmap.get("serverList", []), vbmap.get("vBucketMap", [])
    sources: dict[str, set[int]] = {}
    for vb, vbucket in bucket.vbuckets.items():
        if vbucket.state not in _FED or vb >= len(rows) or not rows[vb]:
            continue
        active = rows[vb][0]
        if 0 <= active < len(servers) and servers[active] != me:
            sources.setdefault(servers[active], set()).add(vb)
    return sources


class ReplicationLink:
    """One DCP connection from this node to ``source``, for some of one bucket's replicas."""

    def __init__(
        self,
        bucket: Bucket,
        source: str,
        me: str,
        credentials: Credentials,
        executor: Executor,
        repair: Callable[[], bool] = lambda: False,
        rolling_back: Counter[int] | None = None,
    ) -> None:
        self.bucket, self.source = bucket, source
        # vbuckets with a rollback under way, shared by the bucket's links (DcpConsumer.requests)
        self.rolling_back: Counter[int] = Counter() if rolling_back is None else rolling_back
        self.credentials, self.executor = credentials, executor
        self.repair = repair
        self.repaired = 0  # documents this link wrote to its source before rolling back
        # SyncWrites: named as the topology names this node (its host:port)
        self.consumer = DcpConsumer(bucket, f"Replica:{me}", consumer_name=me)
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._acks_scheduled = False
        self._acks_due: deque[int] = deque()  # vbuckets named by _ack_due (any thread)
        # Background fetches (_apply): set while a DCP write waits for one (the session reads
        # nothing more until it is done); frames behind it already looked at for prefetching.
        self._unparked: asyncio.Future[None] | None = None
        self._ahead = 0
        self.fetch_waits = 0  # DCP writes that waited for a background fetch (a stat)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.bucket.seqno_ack_listeners.append(self._ack_due)
        self._task = self._loop.create_task(self._run())

    def _ack_due(self, vb: int) -> None:
        # Any thread (the flusher's, under the vbucket's lock): only note the vbucket and
        # schedule the send. Noted before the flag is read, and _send_acks clears the flag
        # before it drains: a vbucket noted after a drain always finds the flag clear.
        loop = self._loop
        if loop is None or vb not in self.consumer.streams:
            return
        self._acks_due.append(vb)
        if self._acks_scheduled:
            return
        self._acks_scheduled = True
        if threading.get_ident() == self._loop_thread:
            loop.call_soon(self._send_acks)  # (no wake-up write for the loop's own turn)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing: nothing to send to
            loop.call_soon_threadsafe(self._send_acks)

    def _send_acks(self) -> None:
        self._acks_scheduled = False
        due, vbuckets = self._acks_due, set()
        while due:
            vbuckets.add(due.popleft())
        if self._writer is not None:  # else they stay due: sent once the stream reads again
            self._send(self.consumer.seqno_acks(vbuckets))

    def cancel(self) -> None:
        """Stop at once: from here on the link applies nothing and acknowledges nothing."""
        with contextlib.suppress(ValueError):
            self.bucket.seqno_ack_listeners.remove(self._ack_due)
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        self.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def set_vbuckets(self, vbuckets: set[int]) -> None:
        self._send(self.consumer.set_vbuckets(vbuckets))
        self._send(self.consumer.requests(_now(), self.rolling_back))

    # -- the connection -----------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        while True:
            try:
                await self._session()
            except (OSError, EOFError, CodecError, ReplicationRefused) as exc:
                log.info("replication from %s: %s; retrying in %.2fs", self.source, exc, backoff)
            except Exception:  # a defect must not end replication for good: log it, go on
                log.exception("replication from %s failed; retrying in %.2fs", self.source, backoff)
            finally:
                self._writer = None
            await asyncio.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    async def _session(self) -> None:
        host, port = self.source.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            parser = FrameParser()
            await self._login(reader, writer, parser)
            self._writer = writer
            self._send(self.consumer.opening(_now()))
            log.info("replicating %d vbuckets from %s", len(self.consumer.streams), self.source)
            while True:
                try:
                    data = await within(reader.read(READ_CHUNK), TICK_S)
                except TimeoutError:
                    data = None
                if data == b"":
                    raise EOFError("the source closed the connection")
                if data:
                    self._received(parser, data)
                    if self._unparked is not None:  # a write waits for a background fetch
                        await self._unparked
                self._send(self.consumer.requests(_now(), self.rolling_back))
        finally:
            self._unparked = None
            self._ahead = 0
            writer.close()

    async def _login(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parser: FrameParser
    ) -> None:
        creds = self.credentials
        plain = f"\0{creds.user}\0{creds.password}".encode()
        for opcode, key, value in (
            (Opcode.SaslAuth, b"PLAIN", plain),
            (Opcode.SelectBucket, self.bucket.name.encode(), b""),
        ):
            request = encode_frame(Magic.ClientRequest, opcode, key=key, value=value)
            frame = await _call(reader, writer, parser, request)
            if frame.status != Status.Success:
                raise ReplicationRefused(f"{Opcode(opcode).name} answered 0x{frame.status:02x}")

    def _received(self, parser: FrameParser, data: bytes) -> None:
        self._ahead = 0  # (not parked: the parser was drained, what was looked at is applied)
        self._apply(parser, parser.feed(data), None)

    def _apply(self, parser: FrameParser, frames: Iterator[Frame], parked: Frame | None) -> None:
        """Apply ``parked`` (a message that waited), then ``frames``, in order, and send the
        answers. A message whose write must read storage first (a non-resident key of a
        full-eviction replica: WouldBlock, before anything changed) parks the link: nothing
        behind it is applied, and nothing more read, until its background fetch lands."""
        out: list[bytes] = []
        now = _now()
        try:
            for frame in itertools.chain([parked] if parked is not None else [], frames):
                self._ahead -= 1
                try:
                    answers, rollbacks = self.consumer.handle(
                        decode_message(frame), frame.size, now
                    )
                except WouldBlock as wait:
                    self._park(parser, frames, frame, wait)
                    return
                out.extend(answers)
                for rollback in rollbacks:
                    self.rolling_back[rollback.vbucket] += 1  # (before any other link may ask)
                    asyncio.get_running_loop().create_task(self._roll_back(rollback))
        finally:
            self._send(out)
        unparked, self._unparked = self._unparked, None
        if unparked is not None and not unparked.done():
            unparked.set_result(None)  # (a parked run got through: the session reads again)

    def _park(
        self, parser: FrameParser, frames: Iterator[Frame], frame: Frame, wait: WouldBlock
    ) -> None:
        """``frame`` waits for the background fetch of ``wait.key``; the DCP writes behind it
        that the parser holds are fetched in the same batch (each still waits its turn)."""
        unparked = self._unparked
        if unparked is None:
            unparked = self._unparked = asyncio.get_running_loop().create_future()
        self.fetch_waits += 1
        if self._ahead <= 0:
            found, self._ahead = pipelined_keys(
                parser.buffered_views(), PREFETCH_FRAMES, _DCP_WRITES
            )
            vbuckets = self.bucket.vbuckets
            for vb, key in found:
                if (vbucket := vbuckets.get(vb)) is not None:
                    vbucket.prefetch(key)
        wait.vbucket.wait_for(wait.key, partial(self._fetched, unparked, parser, frames, frame))

    def _fetched(
        self, unparked: asyncio.Future[None], parser: FrameParser, frames: Iterator[Frame],
        frame: Frame,
    ) -> None:  # fmt: skip
        """The fetch ``frame`` waited for landed (on the loop, while its result is ready):
        apply it and what follows. A failure ends the session as it would have unparked."""
        if unparked is not self._unparked or unparked.done():
            return  # the session ended meanwhile: a new one asks from where the vbuckets are
        try:
            self._apply(parser, frames, frame)
        except Exception as exc:
            self._unparked = None
            unparked.set_exception(exc)

    async def _roll_back(self, rollback: RollbackOrder) -> None:
        try:
            await self._rolling_back(rollback)
        finally:
            self.rolling_back[rollback.vbucket] -= 1
            if self.rolling_back[rollback.vbucket] <= 0:
                del self.rolling_back[rollback.vbucket]
        self._send(self.consumer.requests(_now(), self.rolling_back))

    async def _rolling_back(self, rollback: RollbackOrder) -> None:
        loop = asyncio.get_running_loop()
        if self.repair():
            await self._repair(rollback)
        point = await loop.run_in_executor(
            self.executor, self.bucket.rollback, rollback.vbucket, rollback.seqno
        )
        logs.event(log, "rollback", "vbucket %d rolled back to %d (asked %d) from %s",
                   rollback.vbucket, point, rollback.seqno, self.source,
                   bucket=self.bucket.name, vbucket=rollback.vbucket, seqno=point,
                   asked=rollback.seqno, source=self.source)  # fmt: skip
        self.consumer.rolled_back(rollback.vbucket)

    async def _repair(self, rollback: RollbackOrder) -> None:
        """Offer the source what only we have above the rollback point (dcp/repair.py)."""
        vb, loop = rollback.vbucket, asyncio.get_running_loop()
        diverged = await loop.run_in_executor(
            self.executor, self.bucket.divergence, vb, rollback.seqno
        )
        candidates = [(ours, base) for ours, base in diverged if worth_asking(ours, base)]
        if not candidates:
            return
        try:
            done = await within(self._write_repairs(vb, candidates), REPAIR_TIMEOUT_S)
        except (OSError, EOFError, CodecError, ReplicationRefused, TimeoutError) as exc:
            log.warning("vbucket %d: repairing %s failed (%s); rolling back without it",
                        vb, self.source, exc)  # fmt: skip
            return
        self.repaired += done
        log.info("vbucket %d: repaired %d of %d document(s) on %s before rolling back",
                 vb, done, len(candidates), self.source)  # fmt: skip

    async def _write_repairs(self, vb: int, candidates: list[tuple[Item, Item | None]]) -> int:
        host, port = self.source.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            parser = FrameParser()
            await self._login(reader, writer, parser)
            # Our stored values may be compressed or carry xattrs: written back as they are
            hello = kv.Hello(agent="dcpkv-repair", features=_REPAIR_FEATURES).encode()
            await _call(reader, writer, parser, hello)
            done = 0
            for ours, base in candidates:
                ask = kv.GetMeta(key=ours.key, vbucket=vb).encode()
                answer = await _call(reader, writer, parser, ask)
                repair = decide(ours, base, _meta(answer))
                if repair is None:
                    continue
                written = await _call(reader, writer, parser, _repair_request(vb, repair))
                _refuse_if_moved(written)
                done += written.status == Status.Success  # else changed meanwhile: theirs wins
            return done
        finally:
            writer.close()

    def _send(self, chunks: list[bytes]) -> None:
        if chunks and self._writer is not None:
            self._writer.write(b"".join(chunks))


class ReplicationRefused(DcpkvError):
    """The source refused this node's login or bucket (or no longer holds the vbucket)."""


async def _call(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parser: FrameParser, data: bytes
) -> Frame:
    """Send one request, read its one answer (the connection carries nothing else)."""
    writer.write(data)
    while (frame := next(parser.feed(b""), None)) is None:
        chunk = await reader.read(READ_CHUNK)
        if not chunk:
            raise EOFError("the source closed the connection")
        parser.feed(chunk)  # takes the bytes now; the frames are read lazily above
    return frame


def _refuse_if_moved(frame: Frame) -> None:
    if frame.status == Status.NotMyVbucket:
        raise ReplicationRefused("the source no longer holds the vbucket active")


def _meta(frame: Frame) -> Meta | None:
    _refuse_if_moved(frame)
    if frame.status == Status.KeyEnoent:
        return None
    if frame.status != Status.Success:
        raise ReplicationRefused(f"GetMeta answered 0x{frame.status:02x}")
    answer = kv.GetMetaResponse.decode(frame)
    return Meta(answer.cas, answer.deleted)


def _repair_request(vb: int, repair: RepairWrite) -> bytes:
    if repair.kind is RepairKind.DELETE:
        return kv.Delete(key=repair.key, cas=repair.cas, vbucket=vb).encode()
    kind = kv.Set if repair.kind is RepairKind.SET else kv.Add
    return kind(
        key=repair.key, value=repair.value, flags=repair.flags, expiration=repair.expiry,
        cas=repair.cas, datatype=repair.datatype, vbucket=vb,
    ).encode()  # fmt: skip


class Replicator:
    """Keeps one bucket's replica vbuckets streaming from their active nodes."""

    def __init__(
        self,
        bucket: Bucket,
        me: Callable[[], str],
        config: Callable[[], bytes | None],
        credentials: Credentials,
        executor: Executor,
    ) -> None:
        self.bucket, self.me, self.config = bucket, me, config
        self.credentials, self.executor = credentials, executor
        self.links: dict[str, ReplicationLink] = {}
        self.rolling_back: Counter[int] = Counter()  # shared by the links (ReplicationLink)
        self._named = ""  # the name the links acknowledge prepares under (their consumer_name)
        self._scheduled = False

    def schedule(self) -> None:
        """Reconcile once, soon (many state changes in a row cost one reconcile)."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._reconcile)

    def _reconcile(self) -> None:
        self._scheduled = False
        me = self.me()
        if me != self._named:
            self._rename(me)
        wanted = replica_sources(self.config(), self.bucket, me)
        for source in set(self.links) - set(wanted):
            link = self.links.pop(source)
            asyncio.get_running_loop().create_task(link.stop())
        for source, vbuckets in wanted.items():
            known = self.links.get(source)
            if known is not None:
                known.set_vbuckets(vbuckets)
                continue
            link = ReplicationLink(
                self.bucket, source, me, self.credentials, self.executor,
                repair=lambda: repair_on_rollback(self.config()),
                rolling_back=self.rolling_back,
            )  # fmt: skip
            self.links[source] = link
            link.set_vbuckets(vbuckets)
            link.start()

    def _rename(self, me: str) -> None:
        """This node's name changed (a map named it ``thisNode`` for the first time, or again
        after it was ejected and added back): every link is opened anew under the new name.
        An active counts a replica's acknowledgements under the name its topology gives it, so
        a link kept under the old name would acknowledge prepares that never commit."""
        if self.links:
            log.info("named %s (was %s): reopening %d replication link(s)",
                     me, self._named, len(self.links))  # fmt: skip
        for link in self.links.values():
            link.cancel()  # before its successor opens: never two streams for one vbucket
        self.links.clear()
        self._named = me

    async def stop(self) -> None:
        for link in self.links.values():
            await link.stop()
        self.links.clear()

    def stats(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for link in self.links.values():
            out.update(link.consumer.stats())
            out[f"repaired:{link.consumer.name}"] = str(link.repaired)
            # DCP writes that waited for a background fetch (a full-eviction replica)
            out[f"fetch_waits:{link.consumer.name}"] = str(link.fetch_waits)
        return out


def _now() -> float:
    return asyncio.get_running_loop().time()

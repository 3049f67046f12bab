"""The asyncio shell of the data server: sockets, the flusher, the expiry pager, signals.

Theory of operation
-------------------
:class:`DataServer` opens the buckets (warm-up happens in ``Bucket.__init__``; a fresh bucket
is given every vbucket as active, since one node is the whole cluster), then listens.

Each connection is one :class:`KVProtocol` (an ``asyncio.Protocol``, cheaper than streams).
``data_received`` feeds the bytes to a :class:`FrameParser` and each whole frame, with the
connection's sans-I/O :class:`Connection` state, to :func:`dcpkv.server.dispatch.handle`;
the answers of one read are joined into ONE ``transport.write``, in request order, so
pipelined requests are answered in order with one syscall. A malformed
frame cannot be skipped (the byte stream has lost its framing): the client gets the codec's
status with the bad header's opaque, then the connection closes. A handler that raises
anything unexpected is a bug: the client gets Einternal, the log gets the traceback, and the
connection keeps going. When the transport's write buffer passes its high-water mark, reading
pauses until it drains (a client that pipelines without reading cannot grow our memory).

DCP push path: a connection that opened as a producer (:mod:`dcpkv.server.dcp_handlers`)
also *sends* without being asked. :meth:`KVProtocol.pump` writes one turn,
``producer.next_messages(PUMP_CHUNK, until=...)``: at most 256 KiB and ``PUMP_TURN_S``
(0.5 ms), since live writes spread over many vbuckets are a snapshot each, several us of loop
a visit. When
the producer stopped on those bounds with more ready, the pump comes back with ``call_soon``,
so the loop reads and answers the other connections between turns; a turn that emptied the
ready queue does not come back (new items notify). A client's answer never waits for a turn:
it is written by the read that brought its request (uvloop writes at once), and a request
that arrives during a turn waits for that turn only. A pump runs after every read of the
connection; when the engine queues items in one of its streams' vbuckets (the producer's
bucket listener calls the connection's hook, from any thread, which arms one decision per
loop iteration however many writes there were: the connection is pumped at once or up to
2 ms later as :mod:`dcpkv.server.push_cadence` decides, so a trickle of one-at-a-time writes
is gathered rather than paying a pump per write on the loop that must read the writer's next
request); when the transport drains below its low-water mark (``resume_writing``); and every
``PUMP_TICK_S`` as a safety net. A pump costs what the producer's ready queue holds, never
O(open streams): the producer itself notes which of its streams' vbuckets queued items (see
:mod:`dcpkv.dcp.producer`). Disk backfills are read by ONE backfill worker thread
(:class:`~dcpkv.dcp.backfill.BackfillThread`), never on the loop: the first pump of a
producer attaches it to that thread with a wake-up that, from the worker, does
``call_soon_threadsafe`` to pump that connection when a batch lands. It never writes while
the transport is above its high-water mark, so a slow consumer costs at most
``WRITE_HIGH_WATER`` plus one chunk of server memory; what it has not read stays in the
checkpoints or on disk (the producer's own bound). Every second the liveness timer writes
``noop_due`` and closes connections that are ``is_dead``. A vbucket state change (the
bucket's ``state_listeners``) calls ``vbucket_state_changed`` on every producer of that
bucket; a closed connection calls ``disconnect``. Above the high-water mark reading pauses
too, as on every connection: a consumer that has not read our output for a whole Noop
interval cannot have its Noop answer read either, and is dropped as dead (too slow).

Background fetches (:mod:`dcpkv.engine.bg_fetch`). A request whose key must be read from disk
(a non-resident key under full eviction, an ejected value) raises WouldBlock before it has
changed anything: the connection *parks* it (a copy of its frame), stops reading, and leaves
what follows it in the parser; the Gets among the next ``PREFETCH_FRAMES`` frames it holds are
fetched in the same batch (the fetcher is held until they are all asked: one read, one
landing, the whole pipeline answered in one write). The bucket's fetcher thread reads, the
landing hops onto the loop (``Bucket.land_fetches``), and the parked request runs again, then
what the parser holds, then the connection is read again. Its requests keep their order; other
connections are served meanwhile.

Disk work (``flush_once``, ``shutdown``) runs in ONE executor thread so the flusher never
blocks the loop and never races itself; the vbuckets' in-memory operations run on the loop.
The two threads share the GIL: the flusher gives it up whenever it blocks (the write-ahead
log's fsync, RocksDB's multi-get) or the interpreter makes it switch, and must win it back from
a loop that may be busy for seconds on end, so a flush is a few large write batches
(``RocksStorage.persist``) and the switch interval is 0.2 ms (``SWITCH_INTERVAL_S``);
``stat`` reports ``ep_persistence_lag_ms``, how long the oldest unpersisted write has waited.

Write backpressure. A pipelined writer is acknowledged from memory faster than the flusher
persists (about 110k against 90k items/s here), so without a bound the unpersisted backlog,
and with it what a kill -9 loses, grows for as long as the writer runs (measured: 1.5-3 s
p50, 4-7 s max from acknowledgement to disk with 1024 DCP streams and a saturating writer).
So after a chunk that admitted writes, a connection whose bucket lags more than
``write_lag_limit`` (``WRITE_LAG_PAUSE_S``, or ``FLUSH_LAG_INTERVALS`` flush intervals when
those are longer) stops being read; after each flush the held connections whose bucket is
under half the limit are read again (all of them when flushes fail: writes then answer
TempFail, there is nothing to wait for). The chunk that tripped it is answered first; reading
pauses, so the client's own socket buffers push back. A connection held for its output
(``pause_writing``) and for the flusher resumes only when both let it.
The flusher starts a flush every ``flush_interval_s``, or at once when the previous one took
longer (a sustained load keeps it busy, not idle half the time); a bucket whose backlog is
sparse and young, with nobody asking about persistence, is left to gather for up to three
intervals (``engine/flush_cadence.py``: a flush costs per vbucket); the expiry pager walks the
hash tables every ``expiry_pager_interval_s``. The cyclic garbage collector is kept off the
items (after warm-up and every 0.1 s, what survived is frozen: :mod:`dcpkv.server.gc_policy`);
its full scans of every item held the GIL for hundreds of milliseconds at a time.

Limits (one client must not hurt the others): before a connection logs in, a frame may carry
at most ``PREAUTH_MAX_VALUE`` bytes of value, refused from its header (E2big, then closed) so
an unauthenticated peer never makes us buffer a large body; the full item limit applies once
it has logged in. Past ``max_connections`` a new connection is closed at once (logged,
counted in ``rejected_conns``); one that has not logged in within ``unauth_idle_timeout_s``
is closed (``unauth_timeouts``). A closed connection drops its buffered bytes and its
references at once, not at the next cyclic garbage collection. What a connection buffers is
bounded both ways: in, one frame (the parser); out, ``WRITE_HIGH_WATER`` (reading pauses).

SIGINT/SIGTERM: stop listening, close every connection, then a final flush and
``Bucket.shutdown()`` in the executor thread, which records the clean shutdown (so the next
warm-up does not cut new failover entries).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, cast

from dcpkv.core import event_loop, logs
from dcpkv.core.conflict_resolution import ConflictMode
from dcpkv.core.files import atomic_write
from dcpkv.core.status import Status
from dcpkv.core.tls import server_context
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.backfill import BackfillThread
from dcpkv.dcp.producer import DcpProducer
from dcpkv.engine.bg_fetch import WouldBlock
from dcpkv.engine.bg_fetcher import BgFetcher, Landing
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.document import CompressionMode
from dcpkv.engine.hash_table import EvictionPolicy
from dcpkv.engine.storage import BucketLock
from dcpkv.engine.vbucket import SyncOutcome
from dcpkv.protocol.constants import HEADER_LEN, HelloFeature, Magic
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import Frame, FrameParser, encode_frame
from dcpkv.server.config import ServerSettings
from dcpkv.server.connection import CloseConnection, Connection
from dcpkv.server.dcp_handlers import drop_producer
from dcpkv.server.dispatch import error_answer, handle
from dcpkv.server.fast_path import pipelined_gets, serve_chunk
from dcpkv.server.gc_policy import FREEZE_EVERY_S, CollectorPolicy
from dcpkv.server.latency import LatencyHistogram
from dcpkv.server.push_cadence import delay
from dcpkv.server.replication import Credentials, Replicator
from dcpkv.server.seqno_persistence import answer_waiters
from dcpkv.server.state import ServerState
from dcpkv.server.sync_writes import PendingAnswer, deliver

if TYPE_CHECKING:
    from dcpkv.server.metrics import MetricsServer

log = logging.getLogger("dcpkv.server")

WRITE_HIGH_WATER = 4 * 1024 * 1024
# Before login, a frame's value may be this big at most: SASL, HELLO and the error map fit.
PREAUTH_MAX_VALUE = 16 * 1024
# Values a little over the item limit are read and answered E2big (the connection lives);
# a length beyond this slack is treated as garbage and closes the connection.
VALUE_SLACK = 1024 * 1024
EXPIRY_PAGER_INTERVAL_S = 10.0
# How often SyncWrites past their timeout are aborted (a timeout is answered up to this late).
DURABILITY_TICK_S = 0.05
FLUSH_RETRY_S = 0.25  # between flush attempts while they fail (a full disk, an I/O error)
PUMP_CHUNK = 256 * 1024  # bytes of DCP messages written per pump before yielding the loop
# How long one pump may run before the loop polls the sockets again: PUMP_CHUNK alone let a
# turn of live items spread over many vbuckets (a snapshot each) run ~1,200 of them, ~10 ms,
# and a request arriving meanwhile waits for one turn. A bound on time, not on visits: a
# backlog that drains in well under a turn's time (a paced writer's few late batches) goes
# out in one turn rather than in several with the writer's reads between them.
PUMP_TURN_S = 0.0005
PUMP_TICK_S = 0.05  # safety-net pump of every producer
LIVENESS_TICK_S = 1.0  # Noop / dead-connection check of every producer
# Frames behind a request that waits for a background fetch whose Gets' keys are fetched in
# the same batch (a pipelining client's next requests: one thread round trip for many)
PREFETCH_FRAMES = 256
# The flusher thread gives up the GIL whenever it blocks (an fsync, a multi-get) and at every
# forced switch and, while the event loop is busy, waits up to one switch interval to win it
# back: at CPython's 5 ms default, a flush that gave it up a few hundred times waited seconds
# under load. The other way round, a loop woken by a request
# while the flusher runs Python (taking batches, building rows) waits as long, and a pipelined
# client's batch of 100 Sets is ~0.4 ms of loop work: at 1 ms one connection's Set rate was
# 130-150k (median 139.5k), at 0.2 ms 129-161k (median 157k, higher in 7 of 8 interleaved
# pairs; 0.5 ms gained nothing). Four connections (the loop always busy) kept their rate
# (median 166.5k vs 165.5k) at ~1 us more CPU per Set in forced switches; the live tail's
# latency at 10k and 50k writes/s did not move beyond its noise (3 pairs of bench/latency.py).
SWITCH_INTERVAL_S = 0.0002
# Write backpressure (module docstring): a connection that wrote while its bucket's oldest
# unpersisted write is older than this stops being read until a flush brings the lag under
# half of it. Never below FLUSH_LAG_INTERVALS flush intervals, so a server configured to
# flush rarely (tests, a bulk load) is never held back by its own schedule.
WRITE_LAG_PAUSE_S = 0.25
FLUSH_LAG_INTERVALS = 5


class KVProtocol(asyncio.Protocol):
    """One client connection: bytes in, frames through :class:`Connection`, bytes out."""

    def __init__(self, server: DataServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = FrameParser(max_value_len=PREAUTH_MAX_VALUE)  # raised at login
        self.conn: Connection | None = None
        self.opened_at = time.monotonic()
        self.closing = False
        self.write_paused = False
        self.flush_paused = False  # not read until the flusher catches up (backpressure)
        self._pump_scheduled = False
        self._pump_timer: asyncio.TimerHandle | None = None  # a gap's end (push cadence)
        self._last_pump = -math.inf  # when a pump last wrote something (monotonic clock)
        # A push decision, a pump or a gap's end is pending: new items need no other notice.
        self._push_armed = False
        self._loop: asyncio.AbstractEventLoop | None = None  # (set by _attach, for any thread)
        self._loop_thread = 0
        self._attached: DcpProducer | None = None  # the producer given the backfill thread
        # the precise liveness timer (arm_liveness) and the producer-clock time it is set for
        self._liveness_timer: asyncio.TimerHandle | None = None
        self._liveness_at = math.inf
        # SyncWrites (server/sync_writes.py): the pending answers of the chunk being served
        # (their place in its answers), and what waits behind an undecided one, in order.
        self._deferred: list[tuple[int, PendingAnswer]] = []
        self._held: deque[bytes | PendingAnswer] = deque()
        # Background fetches (module docstring): the request waiting for one, run again when
        # it lands; meanwhile this connection is not read and its later requests wait.
        self._parked: Frame | None = None
        self._ahead = 0  # frames behind the parked one already looked at for prefetching
        self._holding: BgFetcher | None = None  # held while the parked key's batch is asked

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but have its interface.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        if len(self.server.connections) >= self.server.config.max_connections:
            self._refuse(transport)
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Answers are small and latency-bound; Nagle would hold them back.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.conn = Connection(
            self.server.state,
            peer=str(peer),
            peer_host=str(peer[0]) if isinstance(peer, tuple) else str(peer),
            initial_bucket=self.server.config.buckets[0].name,
        )
        self.conn.kick = self.close
        self.conn.send = self._send_later
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.server.connections.add(self)
        self.server.state.connections = len(self.server.connections)

    def _refuse(self, transport: asyncio.Transport) -> None:
        state, limit = self.server.state, self.server.config.max_connections
        state.rejected_conns += 1
        if state.rejected_conns % 100 == 1:  # a flood of refusals must not flood the log
            peer = transport.get_extra_info("peername")
            log.warning("refusing a connection from %s: max_connections (%d) reached", peer, limit)
        self.closing = True
        transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.held_for_flush.discard(self)
        if self._liveness_timer is not None:
            self._liveness_timer.cancel()
            self._liveness_timer = None  # (its callback referenced us)
        if self._pump_timer is not None:
            self._pump_timer.cancel()
            self._pump_timer = None
        conn, self.conn = self.conn, None
        if conn is not None:
            drop_producer(conn)
            conn.detach()
        self.parser.release()  # what a half-received frame buffered goes now, not at a GC
        self.transport = None
        self.server.connections.discard(self)
        self.server.state.connections = len(self.server.connections)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self._ahead = 0  # (the parser was drained: what was looked at is answered)
        self._serve(partial(self._handle_frames, data))

    def _serve(self, frames: Callable[[list[bytes]], None]) -> None:
        """Answer what ``frames`` handles (a chunk read, or a parked request and what it
        held back), then write, hold or pump as one read does."""
        latency = self.server.state.latency  # (None unless metrics are served)
        started = perf_counter_ns() if latency is not None else 0
        out: list[bytes] = []
        bucket = self.conn.bucket if self.conn is not None else None
        writes = bucket.writes_admitted if bucket is not None else 0
        try:
            self._run_frames(frames, out)
        finally:
            holding = self._holding
            if holding is not None:
                self._holding = None
                holding.release()  # the parked key and those prefetched: one batch
        if self._deferred or self._held:
            self._hold(out)
            out = []
            self._release_answers()
        if out and self.transport is not None:
            self.transport.write(b"".join(out))
        if self.closing and self.transport is not None:
            self.transport.close()  # after the queued answers are written
        else:
            if bucket is not None and bucket.writes_admitted != writes:
                self._hold_if_flush_lags(bucket)
            self.pump()
            if self.conn is not None and self.conn.dcp is not None:
                self.arm_liveness()  # enable_noop, a Noop answer: the next moment moved
        if latency is not None:
            latency.observe(perf_counter_ns() - started)

    def _run_frames(self, frames: Callable[[list[bytes]], None], out: list[bytes]) -> None:
        try:
            frames(out)
        except CodecError as exc:
            out.append(self._codec_error_answer(exc))
            self.closing = True
        if self._parked is not None and self._ahead <= 0 and not self.closing:
            self._prefetch()  # (now that the parser holds the whole chunk behind it)

    def _handle_frames(self, data: bytes, out: list[bytes]) -> None:
        conn = self.conn
        assert conn is not None
        parser = self.parser
        serve_chunk(conn, parser, data, out, self._general)

    def _general(self, data: bytes, out: list[bytes]) -> bool:
        """Frames through the parser and the dispatcher; False once the connection closes."""
        conn = self.conn
        assert conn is not None
        parser = self.parser
        for frame in parser.feed(data):
            if not self._answer(conn, frame, out):
                return False
            if conn.user is not None and parser.max_value_len == PREAUTH_MAX_VALUE:
                parser.max_value_len = self.server.max_value_len  # logged in: the item limit
        return True

    def _answer(self, conn: Connection, frame: Frame, out: list[bytes]) -> bool:
        """Handle one frame into ``out``; False once the connection closes or the request
        waits for a background fetch (parked: nothing after it is handled until it lands)."""
        self._ahead -= 1
        try:
            answer = handle(conn, frame)
        except CloseConnection as close:
            if close.args:
                out.append(close.args[0])
            self.closing = True
            return False
        except WouldBlock as wait:
            self._park(frame, wait)
            return False
        except Exception:
            log.exception("handler for opcode 0x%02x failed", frame.opcode)
            answer = error_answer(frame, Status.Einternal)
        if isinstance(answer, PendingAnswer):
            if HelloFeature.UnorderedExecution in conn.features:
                answer.on_ready = partial(self._send_decided, answer)
                if answer.answer is not None:  # decided in its own request (a majority
                    self._send_decided(answer)  # of one): its answer goes out now
            else:
                answer.on_ready = self._release_answers
                self._deferred.append((len(out), answer))
        elif answer:
            out.append(answer)
        return True

    def _park(self, frame: Frame, wait: WouldBlock) -> None:
        """``frame``'s request waits for a background fetch: keep it (its own bytes: the
        read buffer is reused), stop reading, and run it again when the fetch lands."""
        self._parked = parked = dataclasses.replace(
            frame, framing_extras=bytes(frame.framing_extras), extras=bytes(frame.extras),
            key=bytes(frame.key), value=bytes(frame.value),
        )  # fmt: skip
        self.server.state.bg_fetch_waits += 1
        if self.transport is not None:
            self.transport.pause_reading()
        fetcher = self.conn.bucket.bg_fetcher if self.conn and self.conn.bucket else None
        if fetcher is not None and self._holding is None:
            fetcher.hold()  # (released by _serve once the keys behind it are asked too)
            self._holding = fetcher
        wait.vbucket.wait_for(wait.key, partial(self._fetched, parked))

    def _prefetch(self) -> None:
        """Fetch in the same batch the keys of the Gets pipelined behind the parked request
        (each is still run in its turn: it then finds its read in flight or ready)."""
        bucket = self.conn.bucket if self.conn is not None else None
        if bucket is None:
            return
        found, self._ahead = pipelined_gets(self.parser.buffered_views(), PREFETCH_FRAMES)
        vbuckets = bucket.vbuckets
        for vb, key in found:
            vbucket = vbuckets.get(vb)
            if vbucket is not None:
                vbucket.prefetch(key)

    def _fetched(self, parked: Frame) -> None:
        """The fetch ``parked`` waited for landed (on the loop): run it again, then what the
        parser holds behind it, then read again. (It may have run already: a landing whose
        batch held its key as well as an earlier request's.)"""
        if self.closing or self.conn is None or self._parked is not parked:
            return
        self._serve(self._unpark)
        if self._parked is None and not self.closing:
            self._resume_reading()

    def _unpark(self, out: list[bytes]) -> None:
        """The parked request, then what the parser holds behind it, as a chunk just read
        (the fast path answers the Gets whose reads just landed, at a fraction of the general
        path's cost); a request that waits again prefetches what is behind it anew."""
        conn, frame, self._parked = self.conn, self._parked, None
        assert conn is not None and frame is not None
        if self._answer(conn, frame, out):
            self._ahead = 0
            self._handle_frames(self.parser.take_buffered(), out)

    def _resume_reading(self) -> None:
        if (
            self.transport is not None
            and not self.closing
            and not self.write_paused
            and not self.flush_paused
            and self._parked is None
        ):
            self.transport.resume_reading()

    def _hold(self, out: list[bytes]) -> None:
        """Queue a chunk's answers behind the undecided SyncWrites (request order kept)."""
        last = 0
        for at, pending in self._deferred:
            if at > last:
                self._held.append(b"".join(out[last:at]))
            self._held.append(pending)
            last = at
        if len(out) > last:
            self._held.append(b"".join(out[last:]))
        self._deferred.clear()

    def _release_answers(self) -> None:
        """Write the held answers up to the first undecided SyncWrite."""
        held, ready = self._held, []
        while held:
            head = held[0]
            if isinstance(head, PendingAnswer):
                if head.answer is None:
                    break
                head = head.answer
            ready.append(head)
            held.popleft()
        if ready:
            self._send_later(b"".join(ready))

    def _send_decided(self, pending: PendingAnswer) -> None:
        """A SyncWrite's answer on a connection with UnorderedExecution: out once decided,
        whatever was asked after it (which was answered already)."""
        if pending.answer:
            self._send_later(pending.answer)

    def _send_later(self, data: bytes) -> None:
        if self.transport is not None and not self.closing and not self.transport.is_closing():
            self.transport.write(data)

    def _codec_error_answer(self, exc: CodecError) -> bytes:
        log.info("closing %s: bad frame: %s", self.conn.peer if self.conn else "?", exc)
        head = self.parser.peek(HEADER_LEN)
        opcode = head[1] if len(head) > 1 else 0
        opaque = int.from_bytes(head[12:16], "big") if len(head) >= 16 else 0
        return encode_frame(
            Magic.ClientResponse,
            opcode,
            status=exc.status,
            opaque=opaque,
            value=exc.message.encode()[:1024],
        )

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.transport is not None and not self.closing:
            self._resume_reading()
            self.schedule_pump()

    def _hold_if_flush_lags(self, bucket: Bucket) -> None:
        """Stop reading this connection, which just wrote, while its bucket's flusher lags
        (module docstring, write backpressure); :meth:`DataServer.release_held` resumes it."""
        if bucket.persistence_lag() <= self.server.write_lag_limit or bucket.disk_error:
            return  # (a failing disk answers writes TempFail instead: nothing to wait for)
        self.flush_paused = True
        self.server.state.write_holds += 1
        self.server.held_for_flush.add(self)
        if self.transport is not None:
            self.transport.pause_reading()

    def release(self) -> None:
        """The flusher caught up: read this connection again (unless its output is full)."""
        self.flush_paused = False
        self._resume_reading()

    # -- DCP push path -------------------------------------------------------------------------

    @property
    def producer(self) -> DcpProducer | None:
        dcp = self.conn.dcp if self.conn is not None else None
        return dcp if isinstance(dcp, DcpProducer) else None

    def serves(self, bucket: str | None) -> bool:
        return bucket is None or (self.conn is not None and self.conn.bucket_name == bucket)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def schedule_pump(self) -> None:
        if not self._pump_scheduled and self.producer is not None:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def _items_queued(self) -> None:
        # The producer's hook: after every write to one of its streams' vbuckets, from the
        # writer's thread, under the vbucket's lock. Most writes find a push already armed.
        # (No wake-up is lost to a race: the producer notes the item before calling us, and
        # a pump disarms before it takes the notes.)
        if self._push_armed or self._loop is None:
            return
        self._push_armed = True
        if threading.get_ident() == self._loop_thread:
            self._loop.call_soon(self.items_queued)
        else:
            self._loop.call_soon_threadsafe(self.items_queued)

    def items_queued(self) -> None:
        """The connection's vbuckets queued items (once per loop turn that wrote, not per
        write): pump now, or at the end of the gap since the last pump
        (:mod:`dcpkv.server.push_cadence`)."""
        producer = self.producer
        if self._pump_scheduled or self._pump_timer is not None or producer is None:
            return
        now = self.server.monotonic()
        wait = delay(self._last_pump, producer.notified, now, producer.sync_write_waiting)
        if wait is None:
            return  # a pump since took them (no timer: it would hold the next items back)
        if wait <= 0.0:
            # This is a loop turn of its own already (call_soon, after the reads that
            # wrote): pumping here, not a turn later, takes a SyncWrite's prepare to its
            # replica one turn sooner. A bounded pump still comes back after other work.
            self.pump()
        else:
            self._pump_timer = asyncio.get_running_loop().call_later(wait, self._gap_ended)

    def _gap_ended(self) -> None:
        # Through call_soon, not a pump from the timer: uvloop runs what a timer schedules
        # before polling the sockets, so a bounded turn's next turn would follow at once.
        self._pump_timer = None
        self.schedule_pump()

    def pump(self) -> None:
        """Write one turn of ready DCP messages; come back for more after other work."""
        self._pump_scheduled = self._push_armed = False
        if self._pump_timer is not None:
            self._pump_timer.cancel()  # (this pump takes what it waited for)
            self._pump_timer = None
        producer = self.producer
        if producer is None or self.closing or self.write_paused or self.transport is None:
            return
        if producer is not self._attached:
            self._attach(producer)
        chunks = producer.next_messages(PUMP_CHUNK, until=producer.clock.time() + PUMP_TURN_S)
        if chunks:
            self._last_pump = self.server.monotonic()
            # May call pause_writing at once, which stops the next round.
            self.transport.write(b"".join(chunks))
            if producer.has_ready:  # the turn's bound stopped it; else new items notify
                self.schedule_pump()

    def _attach(self, producer: DcpProducer) -> None:
        # Before its first next_messages, which is where backfills start: from now on they
        # are read in the worker thread, whose landings pump this connection.
        loop = asyncio.get_running_loop()

        def wake() -> None:  # from the worker thread: hop onto the loop
            loop.call_soon_threadsafe(self._wake_from_thread)

        producer.attach(self.server.backfill_thread, wake)
        self._loop, self._loop_thread = loop, threading.get_ident()
        producer.queued_hook = self._items_queued
        self._attached = producer

    def _wake_from_thread(self) -> None:
        if not self.closing:
            self.schedule_pump()

    def liveness(self, now: float) -> None:
        producer = self.producer
        if producer is None or self.closing:
            return
        if producer.is_dead(now):
            log.info("closing DCP connection %r: Noop unanswered", producer.name)
            self.close()
            return
        noop = producer.noop_due(now)
        if noop is not None and self.transport is not None:
            self.transport.write(noop)  # not flow-controlled, and tiny: even when paused
        self.arm_liveness()

    def arm_liveness(self) -> None:
        """A timer at the producer's next liveness moment (earlier than any armed one);
        firing early (data went out meanwhile) only re-checks and re-arms."""
        producer = self.producer
        if producer is None or self.closing:
            return
        due = producer.liveness_due()
        if due is None or due >= self._liveness_at:
            return
        if self._liveness_timer is not None:
            self._liveness_timer.cancel()
        delay = max(due - producer.clock.time(), 0.0)
        self._liveness_at = due
        self._liveness_timer = asyncio.get_running_loop().call_later(delay, self._liveness_fired)

    def _liveness_fired(self) -> None:
        self._liveness_timer, self._liveness_at = None, math.inf
        producer = self.producer
        if producer is not None:
            self.liveness(producer.clock.time())


class DataServer:
    """The buckets, the listening socket and the background tasks of one server process."""

    def __init__(self, config: ServerSettings) -> None:
        self.config = config
        self.state = ServerState(config)
        self.connections: set[KVProtocol] = set()
        self.held_for_flush: set[KVProtocol] = set()  # write backpressure (module docstring)
        self.write_lag_limit = max(WRITE_LAG_PAUSE_S, FLUSH_LAG_INTERVALS * config.flush_interval_s)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dcpkv-io")
        # Not the flusher's thread: a flush must never wait behind a backfill read, nor a
        # backfill behind a flush.
        self.backfill_thread = BackfillThread()
        self.max_value_len = 0
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.monotonic = time.monotonic  # the push cadence's clock (tests set their own)
        self._locks: list[BucketLock] = []
        self.collector = CollectorPolicy()
        self._loop: asyncio.AbstractEventLoop | None = None  # (set by start: SyncWrite answers)
        self._loop_thread = 0  # (set by start: SyncWrite answers decided on the loop go now)
        self.metrics: MetricsServer | None = None  # the Prometheus port, when served

    # -- start -------------------------------------------------------------------------------

    def open_buckets(self) -> None:
        for bc in self.config.buckets:
            path = Path(self.config.data_dir)
            path.mkdir(parents=True, exist_ok=True)
            self._locks.append(BucketLock(path, bc.name))
            bucket = Bucket(
                bc.name,
                path,
                num_vbuckets=bc.num_vbuckets,
                memory_quota=bc.memory_quota_mb * 1024 * 1024,
                eviction_policy=EvictionPolicy(bc.eviction_policy),
                compression_mode=CompressionMode(bc.compression_mode),
                durability_timeout_ms=bc.durability_timeout_ms,
                durability_min_level=bc.min_level,
                conflict_mode=ConflictMode(bc.conflict_resolution),
            )
            bucket.sync_outcomes = self._sync_outcomes
            if not bucket.vbuckets and not self.config.managed:
                for vb in range(bc.num_vbuckets):
                    bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
                bucket.flush_once()
            log.info(
                "bucket %s: %d vbuckets, warm-up after %s shutdown",
                bc.name,
                len(bucket.vbuckets),
                "a clean" if bucket.warmed_up_after_clean_shutdown else "an unclean",
            )
            self.state.buckets[bc.name] = bucket
            self.max_value_len = max(self.max_value_len, bucket.max_item_size + VALUE_SLACK)
        if self.config.managed:
            self.state.load_cluster_configs()
            self.state.load_term_fence()

    async def start(self, port_file: Path | None = None) -> int:
        loop = self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        tls = self._tls_context()  # before anything else: a bad certificate fails at once
        with self.collector.warming():  # then the items it loaded are never scanned again
            await loop.run_in_executor(self.executor, self.open_buckets)
        for bucket in self.state.buckets.values():
            bucket.start_background_fetch(partial(self._landed, loop))
        for name, bucket in self.state.buckets.items():
            # first: a handover's map is served before anything reacts to the change
            bucket.state_listeners.append(partial(self.state.vbucket_state_changed, name))
            bucket.state_listeners.append(partial(self._on_state_change, name))
        self._server = await loop.create_server(
            lambda: KVProtocol(self), self.config.host, self.config.port, reuse_address=True
        )
        port = self._server.sockets[0].getsockname()[1]
        self.state.port = port
        if self.config.managed:  # after the bind: a replica names itself by its port
            self._start_replication()
        if tls is not None:
            self._tls_server = await loop.create_server(
                lambda: KVProtocol(self),
                self.config.host,
                self.config.tls_port,
                ssl=tls,
                reuse_address=True,
            )
            self.state.tls_port = self._tls_server.sockets[0].getsockname()[1]
            log.info("dcpkv listening with TLS on %s:%d", self.config.host, self.state.tls_port)
        self._tasks = [
            asyncio.create_task(self._flusher()),
            asyncio.create_task(self._expiry_pager()),
            asyncio.create_task(self._durability_ticker()),
            asyncio.create_task(self._compactor()),
            asyncio.create_task(self._pump_ticker()),
            asyncio.create_task(self._liveness_ticker()),
            asyncio.create_task(self._collector()),
        ]
        log.info("dcpkv listening on %s:%d", self.config.host, port)
        if self.config.metrics_port is not None:
            self._serve_metrics(loop)
        if port_file is not None:
            # Atomic: a launcher polling for the file never reads a partial port number.
            tmp = port_file.with_name(f".{port_file.name}.{os.getpid()}.tmp")
            # The TLS port, when on, is the second line.
            ports = [port] if self.state.tls_port is None else [port, self.state.tls_port]
            atomic_write(port_file, "".join(f"{p}\n" for p in ports).encode(), tmp)
        return port

    def _serve_metrics(self, loop: asyncio.AbstractEventLoop) -> None:
        """Prometheus metrics on their own port and thread (:mod:`dcpkv.server.metrics`)."""
        from dcpkv.server.metrics import MetricsServer  # (prometheus_client: only when asked)

        assert self.config.metrics_port is not None
        self.state.latency = LatencyHistogram()
        self.metrics = MetricsServer(self.state, loop)
        host = self.config.metrics_host
        self.state.metrics_port = self.metrics.start(host, self.config.metrics_port)
        log.info("metrics on http://%s:%d/metrics", host, self.state.metrics_port)

    def _tls_context(self) -> ssl.SSLContext | None:
        c = self.config
        if c.tls_port is None or c.tls_cert is None or c.tls_key is None:
            return None
        return server_context(c.tls_cert, c.tls_key, c.tls_ca)

    @staticmethod
    def _landed(loop: asyncio.AbstractEventLoop, landing: Landing) -> None:
        """A batch of background fetches landed (the fetcher's thread): its waiting requests
        run again on the loop."""
        with contextlib.suppress(RuntimeError):  # (the loop closed: nobody waits any more)
            loop.call_soon_threadsafe(Bucket.land_fetches, landing)

    # -- replication (a managed node) ---------------------------------------------------------

    def _start_replication(self) -> None:
        user, password = next(iter(self.config.users.items()))
        for name, bucket in self.state.buckets.items():
            replicator = Replicator(
                bucket,
                me=lambda: self.state.node_name,
                config=partial(self.state.pushed_config, name),
                credentials=Credentials(user, password),
                executor=self.executor,
            )
            self.state.replicators[name] = replicator
            bucket.state_listeners.append(lambda vb, r=replicator: r.schedule())
            if self.state.pushed_config(name) is not None:  # the map kept before a restart
                replicator.schedule()
        self.state.config_listeners.append(lambda name: self.state.replicators[name].schedule())

    # -- DCP push path -----------------------------------------------------------------------

    def producers(self, bucket: str | None = None) -> list[KVProtocol]:
        return [p for p in self.connections if p.producer is not None and p.serves(bucket)]

    def _on_state_change(self, bucket: str, vb: int) -> None:
        for proto in self.producers(bucket):
            assert proto.producer is not None
            proto.producer.vbucket_state_changed(vb)
            proto.schedule_pump()

    async def _pump_ticker(self) -> None:
        while True:
            await asyncio.sleep(PUMP_TICK_S)
            for proto in self.producers():
                proto.schedule_pump()

    async def _liveness_ticker(self) -> None:
        while True:
            await asyncio.sleep(LIVENESS_TICK_S)
            for proto in self.producers():
                assert proto.producer is not None
                proto.liveness(proto.producer.clock.time())
            self._close_unauthenticated(time.monotonic())

    def _close_unauthenticated(self, now: float) -> None:
        limit = self.config.unauth_idle_timeout_s
        for proto in list(self.connections):
            conn = proto.conn
            if conn is not None and conn.user is None and now - proto.opened_at > limit:
                log.info("closing %s: not logged in after %.0f s", conn.peer, limit)
                self.state.unauth_timeouts += 1
                proto.close()

    # -- background work ---------------------------------------------------------------------

    def _flush_all(self, waiting: bool) -> int:
        """Every bucket whose backlog is due (``engine.flush_cadence``); ``waiting``: someone
        waits on the disk, so every backlog is."""
        interval = self.config.flush_interval_s
        buckets = [b for b in self.state.buckets.values() if not b.closed]
        return sum(b.flush_if_due(interval, waiting=waiting) for b in buckets)

    async def _flusher(self) -> None:
        loop = asyncio.get_running_loop()
        failing = False
        started = loop.time()
        while True:
            # One interval after the previous flush STARTED, not after it ended: a flush that
            # took longer than the interval is followed at once, so under a sustained write
            # load the flusher runs back to back (each flush takes what queued during the
            # last) instead of idling an interval between flushes.
            pause = FLUSH_RETRY_S if failing else self.config.flush_interval_s
            await asyncio.sleep(max(0.0, started + pause - loop.time()))
            started = loop.time()
            # A failing disk is retried whatever the backlog; parked SeqnoPersistence requests
            # and writers held by backpressure wait for this flush.
            waiting = failing or bool(self.state.persistence_waiters or self.held_for_flush)
            try:
                await loop.run_in_executor(self.executor, self._flush_all, waiting)
            except Exception as exc:
                # The batch stays queued in the engine and is retried; meanwhile the bucket
                # answers writes TempFail. Said once, not on every retry.
                if not failing:
                    logs.event(log, "disk_fault", "flush failed: %s: %s; writes answer TempFail "
                               "until a flush succeeds (retrying every %.2f s)",
                               type(exc).__name__, exc, FLUSH_RETRY_S, level=logging.ERROR,
                               error=f"{type(exc).__name__}: {exc}")  # fmt: skip
                failing = True
            else:
                if failing:
                    logs.event(log, "disk_recovered", "flush succeeded again: writes are accepted")
                failing = False
            if self.state.persistence_waiters:
                answer_waiters(self.state.persistence_waiters)
            if self.held_for_flush:
                self.release_held(force=failing)

    def release_held(self, *, force: bool = False) -> None:
        """Read again the connections held for their bucket's flush lag, once it is under
        half the limit (``force``: all of them, as when flushes fail and writes answer
        TempFail)."""
        for proto in list(self.held_for_flush):
            bucket = proto.conn.bucket if proto.conn is not None else None
            if force or bucket is None or bucket.persistence_lag() <= self.write_lag_limit / 2:
                self.held_for_flush.discard(proto)
                proto.release()

    async def _collector(self) -> None:
        """The garbage collector's policy (:mod:`dcpkv.server.gc_policy`), on the loop."""
        policy = self.collector
        while True:
            await asyncio.sleep(FREEZE_EVERY_S)
            full = policy.full_collections
            policy.tick()
            if policy.full_collections != full:
                log.info("full garbage collection: %.3f s, %d unreachable objects in all",
                         policy.last_full_pause_s, policy.freed_by_full)  # fmt: skip

    def _sync_outcomes(self, vb: int, outcomes: list[SyncOutcome]) -> None:
        # From the loop or the flusher thread, under the vbucket's lock. On the loop (the
        # replica's ack that committed them was just read) the clients are answered now: a
        # hop would hold every answer behind the rest of the loop's turn (the pump of the
        # commits, other connections' reads). Answering only writes bytes. From the flusher
        # (a persistence completed a fence): handed over.
        assert self._loop is not None  # buckets open once the loop runs
        if threading.get_ident() == self._loop_thread:
            deliver(outcomes)
        else:
            self._loop.call_soon_threadsafe(deliver, outcomes)

    async def _every_bucket(
        self, interval_s: float, chore: str, run: Callable[[Bucket], object]
    ) -> None:
        """Run ``chore`` on every bucket every ``interval_s``; a failure is logged, not fatal."""
        while True:
            await asyncio.sleep(interval_s)
            for bucket in self.state.buckets.values():
                try:
                    run(bucket)
                except Exception:
                    log.exception("%s failed on bucket %s", chore, bucket.name)

    def _durability_ticker(self) -> Coroutine[object, object, None]:
        """Time SyncWrites out (their prepares abort; their clients get SyncWriteAmbiguous)."""
        return self._every_bucket(DURABILITY_TICK_S, "durability tick", Bucket.durability_tick)

    def _expiry_pager(self) -> Coroutine[object, object, None]:
        return self._every_bucket(EXPIRY_PAGER_INTERVAL_S, "expiry pager", Bucket.expiry_pager)

    async def _compactor(self) -> None:
        """Purge old tombstones now and then; each purge raises the vbuckets' purge seqnos."""
        loop = asyncio.get_running_loop()
        age = self.config.tombstone_purge_age_s
        while True:
            await asyncio.sleep(self.config.compaction_interval_s)
            for bucket in self.state.buckets.values():
                try:
                    await loop.run_in_executor(
                        self.executor, partial(bucket.compact, purge_older_than_secs=age)
                    )
                except Exception:
                    log.exception("compaction failed on bucket %s", bucket.name)

    # -- stop --------------------------------------------------------------------------------

    async def stop(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        for listener in (self._server, self._tls_server):
            if listener is not None:
                listener.close()
        for proto in list(self.connections):
            proto.closing = True
            if proto.transport is not None:
                proto.transport.close()
        for replicator in self.state.replicators.values():
            await replicator.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        loop = asyncio.get_running_loop()
        # Same thread as the flusher: the final flush cannot interleave with a running one.
        self.backfill_thread.stop()  # after every producer let go of its backfills
        await loop.run_in_executor(self.executor, self._shutdown_buckets)
        self.executor.shutdown(wait=True)
        log.info("dcpkv stopped cleanly")

    def _shutdown_buckets(self) -> None:
        for bucket in self.state.buckets.values():
            if not bucket.closed:
                bucket.shutdown()
        for lock in self._locks:
            lock.release()


async def serve(config: ServerSettings, port_file: Path | None = None) -> None:
    """Run until SIGINT/SIGTERM, then shut down cleanly."""
    server = DataServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start(port_file)
        await stop.wait()
        log.info("signal received, shutting down")
    finally:
        await server.stop()


def run(
    config: ServerSettings,
    port_file: Path | None = None,
    *,
    log_level: str = "info",
    log_format: str = "text",
) -> None:
    """Configure logging (:mod:`dcpkv.core.logs`), pick uvloop when installed, serve until a
    signal."""
    logs.configure(log_level, log_format)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    event_loop.run(serve(config, port_file))

"""DCP opcodes on the data server: Open, Control, streams, acks, barriers, ``stat dcp``.

Theory of operation
-------------------
A connection becomes a DCP *producer* connection with DcpOpen carrying the Producer flag:
the handler puts a sans-I/O :class:`DcpProducer` in ``Connection.dcp`` and records the
connection under (bucket, name) in ``ServerState.dcp_producers``. A second Open with a name
already in use on that bucket disconnects the first producer and closes its connection
(cursor names are per connection name, so two live producers must not share one). An Open
without the Producer flag (a consumer: replication into this node) answers NotSupported until
replicas exist; so does a second Open on a connection that is already a producer (Einval).

Every other DCP request is decoded with the codec and handed to ``DcpProducer.handle``; its
answer (None for BufferAck and barriers) is the reply. The DCP messages the producer pushes
(markers, mutations, Noops, barrier echoes...) are not written here: the asyncio shell asks
``next_messages`` after each read, on engine writes and when the socket drains
(:mod:`dcpkv.server.app`).

Gates: authentication and a selected bucket are required for every DCP opcode. A DCP
opcode on a connection that did not Open as a producer answers **Einval** ("not a DCP
connection"), with one exception: GetFailoverLog, which any authenticated connection may use
to read a vbucket's failover log (monitoring tools and SDKs do). The consumer's responses to
our Noop and SetVbucketState arrive as responses (magic 0x81) and are routed here through
``RESPONSE_HANDLERS``.

``stat dcp``: the Stat opcode lives in :mod:`dcpkv.server.kv_handlers`; this module wraps its
handler and answers the group ``dcp`` itself: every producer of the selected bucket's
``stats()`` (spec 002 naming, ``stat:name`` and ``stat:vbucket:name``) plus bucket totals.
"""

from __future__ import annotations

from collections.abc import Iterator

from dcpkv.core.status import Status
from dcpkv.dcp.producer import DcpProducer
from dcpkv.protocol import dcp
from dcpkv.protocol.base import Message
from dcpkv.protocol.constants import Opcode, OpenFlag
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import Frame
from dcpkv.protocol.messages import decode_message
from dcpkv.server import kv_handlers  # noqa: F401  (registers Stat, which we wrap below)
from dcpkv.server.connection import (
    HANDLERS,
    RESPONSE_HANDLERS,
    Connection,
    Reply,
    handler,
    not_my_vbucket,
    response,
)

# DCP requests a producer connection may receive; the producer answers those it does not
# take from a consumer (AddStream, Mutation...) with NotSupported.
_PRODUCER_OPCODES = (
    Opcode.DcpControl, Opcode.DcpStreamRequest, Opcode.DcpCloseStream, Opcode.DcpBufferAck,
    Opcode.DcpBarrier, Opcode.DcpNoop, Opcode.DcpAddStream, Opcode.DcpStreamEnd,
    Opcode.DcpSnapshotMarker, Opcode.DcpMutation, Opcode.DcpDeletion, Opcode.DcpExpiration,
    Opcode.DcpSetVbucketState, Opcode.DcpSystemEvent, Opcode.DcpPrepare,
    Opcode.DcpSeqnoAcknowledged, Opcode.DcpCommit, Opcode.DcpAbort, Opcode.DcpSeqnoAdvanced,
    Opcode.DcpOsoSnapshot,
)  # fmt: skip


def _decode(frame: Frame) -> Message:
    try:
        return decode_message(frame)
    except CodecError as exc:
        raise Reply(Status(exc.status), exc.message.encode()[:1024]) from None


def _producer(conn: Connection) -> DcpProducer:
    if not isinstance(conn.dcp, DcpProducer):
        raise Reply(Status.Einval, b"not a DCP producer connection (send DcpOpen first)")
    return conn.dcp


def drop_producer(conn: Connection) -> None:
    """Forget ``conn``'s producer: release its cursors and its name (idempotent)."""
    producer = conn.dcp
    if not isinstance(producer, DcpProducer):
        return
    producer.disconnect()
    key = (conn.bucket_name or "", producer.name)
    if conn.server.dcp_producers.get(key) is conn:
        del conn.server.dcp_producers[key]


@handler(Opcode.DcpOpen)
def _open(conn: Connection, frame: Frame) -> bytes:
    msg = _decode(frame)
    assert isinstance(msg, dcp.DcpOpen)
    if conn.dcp is not None:
        raise Reply(Status.Einval, b"this connection is already a DCP connection")
    if not msg.flags & OpenFlag.Producer:
        raise Reply(Status.NotSupported, b"DCP consumer connections are not supported yet")
    key = (conn.bucket_name or "", msg.name)
    old = conn.server.dcp_producers.get(key)
    if old is not None:
        conn.server.log.info("DCP name %r reused: closing the older connection", msg.name)
        drop_producer(old)
        old.kick()
    conn.dcp = DcpProducer(conn.bucket, msg.name, msg.flags, clock=conn.bucket.clock)
    conn.server.dcp_producers[key] = conn
    return response(frame)


@handler(*_PRODUCER_OPCODES)
def _dcp_request(conn: Connection, frame: Frame) -> bytes | None:
    producer = _producer(conn)
    return producer.handle(_decode(frame))


@handler(Opcode.DcpGetFailoverLog)
def _failover_log(conn: Connection, frame: Frame) -> bytes:
    vbucket = conn.bucket.vbuckets.get(frame.vbucket)
    if vbucket is None:
        raise not_my_vbucket(conn)
    _decode(frame)  # validates the layout (no extras, key or value)
    entries = vbucket.failover.entries
    return dcp.GetFailoverLogResponse(opaque=frame.opaque, failover_log=entries).encode()


def _dcp_response(conn: Connection, frame: Frame) -> None:
    """The consumer's answer to our Noop or SetVbucketState: no reply, ever."""
    try:
        msg = decode_message(frame)
    except CodecError:
        return None  # a malformed answer to a server message: nothing sensible to say
    _producer(conn).handle(msg)
    return None


RESPONSE_HANDLERS[Opcode.DcpNoop] = _dcp_response
RESPONSE_HANDLERS[Opcode.DcpSetVbucketState] = _dcp_response


# -- stat dcp ----------------------------------------------------------------------------------

_kv_stat, _stat_auth, _stat_bucket = HANDLERS[Opcode.Stat]


@handler(Opcode.Stat, auth=_stat_auth, bucket=_stat_bucket)
def _stat(conn: Connection, frame: Frame) -> bytes | None:
    group = bytes(frame.key).decode("ascii", "replace").partition(" ")[0]
    if group != "dcp":
        return _kv_stat(conn, frame)
    parts = [
        response(frame, key=name.encode(), value=value.encode()) for name, value in dcp_stats(conn)
    ]
    parts.append(response(frame))  # an empty key ends the answer
    return b"".join(parts)


def dcp_stats(conn: Connection) -> Iterator[tuple[str, str]]:
    """Totals for the selected bucket, then each producer's own stats, by connection name."""
    producers = sorted(
        (c.dcp for (bucket, _), c in conn.server.dcp_producers.items()
         if bucket == conn.bucket_name and isinstance(c.dcp, DcpProducer)),
        key=lambda p: p.name,
    )  # fmt: skip
    yield "ep_dcp_count", str(len(producers))
    yield "ep_dcp_producer_count", str(len(producers))
    yield "ep_dcp_items_sent", str(sum(p.items_sent for p in producers))
    yield "ep_dcp_total_bytes", str(sum(p.bytes_sent for p in producers))
    for producer in producers:
        yield f"type:{producer.name}", "producer"
        yield from producer.stats().items()

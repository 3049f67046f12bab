"""DCP opcodes on the data server: Open, Control, streams, acks, barriers, ``stat dcp``.

Theory of operation
-------------------
A connection becomes a DCP *producer* connection with DcpOpen carrying the Producer flag:
the handler puts a sans-I/O :class:`DcpProducer` in ``Connection.dcp`` and records the
connection under (bucket, name) in ``ServerState.dcp_producers``. A second Open with a name
already in use on that bucket disconnects the first producer and closes its connection
(cursor names are per connection name, so two live producers must not share one), when the
same user (or a cluster admin) opens it; another user is answered KeyEexists. An Open
without the Producer flag answers NotSupported (replication into this node is the node's own
doing: :mod:`dcpkv.server.replication` dials its sources); a second Open on a connection that
is already a producer answers Einval.

Every other DCP request arrives decoded (the dispatcher used the codec) and is handed to
``DcpProducer.handle``; its answer (None for BufferAck and barriers) is the reply, already
encoded: the producer encodes everything it sends, answers included. The DCP messages the
producer pushes (markers, mutations, Noops, barrier echoes...) are not written here: the
asyncio shell asks ``next_messages`` after each read, on engine writes and when the socket
drains (:mod:`dcpkv.server.app`).

Gates: authentication and a selected bucket are required for every DCP opcode. A DCP
opcode on a connection that did not Open as a producer answers **Einval** ("not a DCP
connection"), with one exception: GetFailoverLog, which any authenticated connection may use
to read a vbucket's failover log (monitoring tools and SDKs do). The consumer's responses to
our Noop and SetVbucketState arrive as responses (magic 0x81) and the dispatcher routes
them to :func:`consumer_response`. ``stat dcp`` is a group of :mod:`dcpkv.server.stats`.
"""

from __future__ import annotations

from dcpkv.core.rbac import Privilege
from dcpkv.core.status import Status
from dcpkv.dcp.producer import DcpProducer
from dcpkv.protocol import dcp
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import HelloFeature, OpenFlag
from dcpkv.server.connection import Connection, Reply, not_my_vbucket
from dcpkv.server.session import ok


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


def open_(conn: Connection, req: dcp.DcpOpen) -> GenericResponse:
    if conn.dcp is not None:
        raise Reply(Status.Einval, b"this connection is already a DCP connection")
    if not req.flags & OpenFlag.Producer:
        raise Reply(Status.NotSupported, b"consumer Open: a node replicates by dialling sources")
    key = (conn.bucket_name or "", req.name)
    old = conn.server.dcp_producers.get(key)
    if old is not None and old.user != conn.user and not _is_admin(conn):
        # Taking over a name kicks its connection: only its own user (or an admin) may, or a
        # DCP reader could cut a replica's stream by naming it.
        raise Reply(Status.KeyEexists, b"this DCP connection name is in use by another user")
    if old is not None:
        conn.server.log.info("DCP name %r reused: closing the older connection", req.name)
        drop_producer(old)
        old.kick()
    conn.dcp = DcpProducer(
        conn.bucket, req.name, req.flags, clock=conn.bucket.clock,
        snappy=HelloFeature.Snappy in conn.features,
    )  # fmt: skip
    conn.server.dcp_producers[key] = conn
    return ok(req)


def _is_admin(conn: Connection) -> bool:
    grants = conn.server.users.grants(conn.user)
    return grants is not None and grants.allows(frozenset({Privilege.CLUSTER_ADMIN}), None)


def producer_request(conn: Connection, req: Message) -> bytes | None:
    """Control, StreamRequest, CloseStream, BufferAck, Barrier...: the producer's business."""
    return _producer(conn).handle(req)


def get_failover_log(conn: Connection, req: dcp.GetFailoverLog) -> dcp.GetFailoverLogResponse:
    vbucket = conn.bucket.vbuckets.get(req.vbucket)
    if vbucket is None:
        raise not_my_vbucket(conn)
    entries = vbucket.failover.entries
    return dcp.GetFailoverLogResponse(opaque=req.opaque, failover_log=entries)


def consumer_response(conn: Connection, msg: Message) -> None:
    """The consumer's answer to our Noop or SetVbucketState: no reply, ever."""
    _producer(conn).handle(msg)

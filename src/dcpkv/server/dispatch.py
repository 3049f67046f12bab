"""From a frame to its answer: the one table of what the server answers, and how.

Theory of operation
-------------------
:data:`ROUTES` maps every request opcode the server serves to a :class:`Route`: the codec's
decoder for that opcode, the handler, and the gates it needs (authenticated, bucket selected,
and the privileges of :mod:`dcpkv.core.rbac` the user's roles must grant on that bucket).
:func:`handle` is the whole life of a request:

1. a response frame (a DCP consumer answering our Noop or SetVbucketState) goes to the DCP
   handlers on a producer connection, and is answered UnknownCommand anywhere else; an answer
   to a server request (magic 0x83, a client answering a map notification) is not answered;
2. an opcode not in the table answers UnknownCommand; a closed gate answers Eaccess (not
   authenticated) or NoBucket (no bucket selected), before anything is decoded; a user
   whose roles lack the route's privileges gets Eaccess too, counted (stat ``rbac_eaccess``):
   a DCP reader cannot write, a data reader cannot open DCP, only a cluster admin changes
   vbucket states, the cluster map or the users. Routes that need no privilege (Stat, the
   seqnos, failover logs, the map) are open to any role on the selected bucket: selecting it
   already required one. :func:`closed_gate` is that check alone, and the request fast path
   (:mod:`dcpkv.server.fast_path`) asks it too before it answers an opcode of this table
   itself: a gate changed here holds on both paths;
3. a durability requirement in the framing extras (a SyncWrite) is never ignored: the codec's
   status when the item is malformed (:mod:`dcpkv.protocol.durability`); a bucket's
   ``durability_min_level`` raises every mutation's requirement to at least that level (a
   mutation with none gets it: :func:`~dcpkv.protocol.durability.at_least`); otherwise
   :mod:`dcpkv.server.sync_writes` refuses it (Einval on a route that takes none,
   DurabilityImpossible where it cannot be met) or runs the request as a SyncWrite, answered
   when it commits (a :class:`~dcpkv.server.sync_writes.PendingAnswer`). Answering such a
   write Success from memory would acknowledge a durability that does not hold (the fast path
   takes no frame with framing extras: they all come here);
4. the codec decodes the request: a malformed one is answered with the codec's status and
   message (the frame boundaries are intact, so the connection goes on). What "malformed"
   means is the codec's alone: no handler looks at raw bytes;
5. the handler returns its answer: a response message, a list of them (Stat), bytes already
   encoded by a sans-I/O core (the DCP producer encodes everything it sends), or None (quiet
   opcodes, BufferAck). It refuses with :class:`Reply`, answered as a GenericResponse with that
   status and value.

Anything else a handler raises is a bug; the shell (:mod:`dcpkv.server.app`) answers
Einternal and logs it. The table is written out here, in one place, rather than assembled by
decorators at import: what the server serves is read in one screen, and nothing depends on
the order modules are imported in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dcpkv.core.rbac import Privilege
from dcpkv.core.status import Status
from dcpkv.protocol import dcp, kv, subdoc
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.durability import at_least, durability_requirement
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import Frame
from dcpkv.protocol.messages import decode_message
from dcpkv.server import (
    dcp_handlers,
    kv_handlers,
    seqno_persistence,
    session,
    stats,
    subdoc_handlers,
    sync_writes,
    vbucket_handlers,
    with_meta,
)
from dcpkv.server.connection import Connection, Reply

Answer = Message | list[kv.StatResponse] | bytes | None
Handler = Callable[[Connection, Any], Answer]


@dataclass(frozen=True, slots=True)
class Route:
    decode: Callable[[Frame], Message]
    handler: Handler
    auth: bool = True  # needs an authenticated user
    bucket: bool = True  # needs a selected bucket
    needs: frozenset[Privilege] = frozenset()  # granted on the selected bucket (or on all)
    durable: bool = False  # a mutation: the route a durability requirement may ride on


Needs = frozenset[Privilege]
Routes = dict[int, Route]
_READ: Needs = frozenset({Privilege.READ})
_WRITE: Needs = frozenset({Privilege.WRITE})
_READ_WRITE: Needs = _READ | _WRITE  # answers with the value it changed (Incr, GAT)
_DCP: Needs = frozenset({Privilege.DCP})
_BUCKET_ADMIN: Needs = frozenset({Privilege.BUCKET_ADMIN})
_ADMIN: Needs = frozenset({Privilege.CLUSTER_ADMIN})


def _open(decode: Callable[[Frame], Message], handler: Handler, *, bucket: bool = False) -> Route:
    """A route any client may take before logging in (bucket=False: or before SelectBucket)."""
    return Route(decode, handler, auth=False, bucket=bucket)


def _cluster_admin(decode: Callable[[Frame], Message], handler: Handler) -> Route:
    """A cluster admin's route that needs no selected bucket (it names its bucket itself)."""
    return Route(decode, handler, bucket=False, needs=_ADMIN)


def _routes(handler: Handler, *types: type[kv.Request], needs: Needs = frozenset()) -> Routes:
    return {t.OPCODE: Route(t.decode, handler, needs=needs) for t in types}


def _mutations(handler: Handler, *types: type[kv.Request], needs: Needs = _WRITE) -> Routes:
    """Routes that change a document: a client may ask for their durability."""
    return {t.OPCODE: Route(t.decode, handler, needs=needs, durable=True) for t in types}


# DCP requests a producer connection may receive; the producer answers those it does not take
# from a consumer (AddStream, Mutation...) with NotSupported.
_PRODUCER_REQUESTS = (
    dcp.DcpControl, dcp.StreamRequest, dcp.CloseStream, dcp.BufferAck, dcp.DcpBarrier,
    dcp.DcpNoop, dcp.AddStream, dcp.StreamEnd, dcp.Mutation, dcp.Expiration, dcp.SetVbucketState,
    dcp.SystemEvent, dcp.Prepare, dcp.SeqnoAcknowledged, dcp.Commit, dcp.Abort,
    dcp.SeqnoAdvanced, dcp.OsoSnapshot,
)  # fmt: skip

ROUTES: dict[int, Route] = {
    # session: the gates
    Opcode.Noop: _open(kv.Noop.decode, session.noop),
    Opcode.Version: _open(kv.Version.decode, session.version),
    Opcode.Quit: _open(kv.Quit.decode, session.quit_),
    Opcode.Hello: _open(kv.Hello.decode, session.hello),
    Opcode.SaslListMechs: _open(kv.SaslListMechs.decode, session.sasl_list_mechs),
    Opcode.SaslAuth: _open(kv.SaslAuth.decode, session.sasl_auth),
    Opcode.SaslStep: _open(kv.SaslStep.decode, session.sasl_step),
    Opcode.GetErrorMap: _open(kv.GetErrorMap.decode, session.get_error_map),
    Opcode.SelectBucket: Route(kv.SelectBucket.decode, session.select_bucket, bucket=False),
    Opcode.GetClusterConfig: Route(kv.GetClusterConfig.decode, session.get_cluster_config),
    # documents
    **_routes(kv_handlers.get, kv.Get, kv.GetQ, kv.GetK, kv.GetKQ, needs=_READ),
    **_mutations(kv_handlers.store, kv.Set, kv.SetQ, kv.Add, kv.AddQ, kv.Replace, kv.ReplaceQ),
    **_mutations(kv_handlers.delete, kv.Delete, kv.DeleteQ),
    **_mutations(kv_handlers.concat, kv.Append, kv.Prepend),
    **_mutations(kv_handlers.arith, kv.Increment, kv.Decrement, needs=_READ_WRITE),
    **_routes(kv_handlers.touch, kv.Touch, needs=_WRITE),
    **_routes(kv_handlers.touch, kv.GAT, needs=_READ_WRITE),
    **_routes(kv_handlers.flush, kv.Flush, needs=_BUCKET_ADMIN),
    **_routes(kv_handlers.observe_seqno, kv.ObserveSeqno),
    **_routes(kv_handlers.get_meta, kv.GetMeta, kv.GetqMeta, needs=_READ),
    # XDCR's with-meta writes (a replicator's user needs the write privilege on the bucket)
    **_routes(with_meta.with_meta, *kv.WITH_META_TYPES, needs=_WRITE),
    # the spec's blocking wait for persistence (any user of the bucket, like ObserveSeqno)
    **_routes(seqno_persistence.seqno_persistence, kv.SeqnoPersistence),
    **_routes(stats.stat, kv.Stat),
    # sub-document: one request type for every opcode of the range
    **{
        op: Route(
            subdoc.SubdocRequest.decode,
            subdoc_handlers.subdoc_request,
            needs=_READ if op in subdoc.LOOKUP_OPS else _WRITE,
            durable=op not in subdoc.LOOKUP_OPS,
        )
        for op in subdoc.ALL_OPS
    },
    # vbucket control
    **_routes(vbucket_handlers.set_vbucket, kv.SetVbucket, needs=_ADMIN),
    **_routes(vbucket_handlers.get_vbucket, kv.GetVbucket),
    **_routes(vbucket_handlers.del_vbucket, kv.DelVbucket, needs=_ADMIN),
    **_routes(vbucket_handlers.all_vb_seqnos, kv.GetAllVbSeqnos),
    Opcode.SetClusterConfig: _cluster_admin(kv.SetClusterConfig.decode, session.set_cluster_config),
    Opcode.RbacRefresh: _cluster_admin(kv.RbacRefresh.decode, session.rbac_refresh),
    # DCP: Open makes a producer; the rest is the producer's (it refuses what a consumer
    # would take: AddStream, Mutation...); GetFailoverLog is open to any connection
    **_routes(dcp_handlers.open_, dcp.DcpOpen, needs=_DCP),
    **_routes(dcp_handlers.get_failover_log, dcp.GetFailoverLog),
    **_routes(dcp_handlers.producer_request, *_PRODUCER_REQUESTS, needs=_DCP),
    Opcode.DcpSnapshotMarker: Route(
        dcp.decode_snapshot_marker, dcp_handlers.producer_request, needs=_DCP
    ),
    Opcode.DcpDeletion: Route(dcp.decode_deletion, dcp_handlers.producer_request, needs=_DCP),
}

# Answers a DCP consumer sends back to the producer's own requests.
CONSUMER_RESPONSES = frozenset({Opcode.DcpNoop, Opcode.DcpSetVbucketState})


@dataclass(frozen=True, slots=True)
class ClosedGate:
    """A gate of a route that a connection does not pass: the refusal to answer."""

    status: Status
    message: bytes = b""
    rbac: bool = False  # the user's roles lack a privilege (counted: stat ``rbac_eaccess``)


_NOT_AUTHENTICATED = ClosedGate(Status.Eaccess)
_NO_BUCKET = ClosedGate(Status.NoBucket)
_NOT_GRANTED = ClosedGate(Status.Eaccess, b"the user's roles do not allow this", rbac=True)


def closed_gate(conn: Connection, route: Route) -> ClosedGate | None:
    """The first gate of ``route`` that ``conn`` does not pass (None: it passes them all):
    authenticated, bucket selected, the route's privileges granted on that bucket."""
    if route.auth and conn.user is None:
        return _NOT_AUTHENTICATED
    if route.bucket and conn.bucket_name is None:
        return _NO_BUCKET
    if route.needs and not _granted(conn, route.needs):
        return _NOT_GRANTED
    return None


# A request's answer: bytes (None: no answer), or a SyncWrite's answer to come.
Reaction = bytes | sync_writes.PendingAnswer


def handle(conn: Connection, frame: Frame) -> Reaction | None:
    """The bytes answering ``frame`` (None: no answer; a PendingAnswer: decided later); see
    the module docstring."""
    if not frame.is_request:
        return _response(conn, frame)
    route = ROUTES.get(frame.opcode)
    if route is None:
        return error_answer(frame, Status.UnknownCommand)
    conn.server.ops[frame.opcode] += 1
    closed = closed_gate(conn, route)
    if closed is not None:
        conn.server.eaccess += closed.rbac
        return error_answer(frame, closed.status, closed.message)
    if frame.framing_extras or (route.durable and conn.bucket.durability_min_level):
        durable = _with_durability(conn, frame, route)
        if durable is not None:
            return durable
    try:
        answer = route.handler(conn, route.decode(frame))
    except Reply as reply:
        return error_answer(frame, reply.status, reply.value, cas=reply.cas)
    except CodecError as exc:
        return error_answer(frame, exc.status, exc.message.encode()[:1024])
    if isinstance(answer, Message):  # the common case first
        return answer.encode()
    if answer is None or isinstance(answer, bytes):
        return answer
    return b"".join([m.encode() for m in answer])


def _with_durability(conn: Connection, frame: Frame, route: Route) -> Reaction | None:
    """The answer of a request with a durability requirement (step 3); None when it carries
    none."""
    try:
        requirement = durability_requirement(frame.framing_extras)
    except CodecError as exc:
        return error_answer(frame, exc.status, exc.message.encode()[:1024])
    if not route.durable:
        if requirement is None:
            return None
        return error_answer(frame, Status.Einval, b"this command takes no durability requirement")
    requirement = at_least(requirement, conn.bucket.durability_min_level)
    if requirement is None:
        return None
    if not sync_writes.usable_topology(conn, frame.vbucket):
        return error_answer(frame, Status.DurabilityImpossible, sync_writes.NO_TOPOLOGY)
    try:
        return sync_writes.sync_write(conn, route.decode(frame), route.handler, requirement)
    except Reply as reply:
        return error_answer(frame, reply.status, reply.value, cas=reply.cas)
    except CodecError as exc:
        return error_answer(frame, exc.status, exc.message.encode()[:1024])


def _granted(conn: Connection, needs: Needs) -> bool:
    grants = conn.server.users.grants(conn.user)
    return grants is not None and grants.allows(needs, conn.bucket_name)


def _response(conn: Connection, frame: Frame) -> bytes | None:
    if frame.magic == Magic.ServerResponse:
        return None  # a client answering a server request (a map notification): no reply
    if conn.dcp is None or frame.opcode not in CONSUMER_RESPONSES:
        return error_answer(frame, Status.UnknownCommand)
    try:
        msg = decode_message(frame)
    except CodecError:
        return None  # a malformed answer to a server message: nothing sensible to say
    dcp_handlers.consumer_response(conn, msg)
    return None


def error_answer(frame: Frame, status: int, value: bytes = b"", *, cas: int = 0) -> bytes:
    """A GenericResponse to ``frame`` with ``status``: every refusal, whoever refuses."""
    return GenericResponse(
        opcode=frame.opcode,
        opaque=frame.opaque,
        status=status,
        value=value,
        cas=cas,
        to_server=frame.magic == Magic.ServerRequest,
    ).encode()

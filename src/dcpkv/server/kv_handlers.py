"""Document opcodes: the memcached operations on keys, GetMeta and ObserveSeqno.

Theory of operation
-------------------
Each handler takes a decoded request (:mod:`dcpkv.protocol.kv`), calls the engine
(:mod:`dcpkv.engine`) and returns the typed answer. Handlers run on the event loop: the
vbucket operations are in-memory and take only the vbucket's short lock, so they never wait
for the flusher thread.

Errors: an engine refusal is an :class:`EngineError` whose ``status`` names the memcached
status; :func:`refusal` turns it into a :class:`Reply` with that status (NotMyVbucket carries
the cluster map so a smart client re-routes). The codec has already refused a malformed
request (wrong extras, missing key...); what is left here is what needs the connection or the
engine: the vbucket's state, the negotiated datatype.

Quiet opcodes (GetQ, GetKQ, SetQ, ...) answer nothing on the common outcome (a miss for the
quiet gets, success for the quiet mutations); the client learns the rest with a Noop.

Flush deletes every live key of the bucket's active vbuckets through the ordinary delete path
(``Bucket.delete_all``), the keys only storage holds under full eviction too, so each gets a
tombstone with a seqno: DCP consumers and the flusher see the deletions like any others (a
wholesale "truncate" would leave consumers holding keys the bucket no longer has). It runs on
the event loop, one key's lock at a time, reading storage in place, so it is O(items) and meant
for tests and small buckets, as in Couchbase, where flush is an admin operation off by default.

With the MutationSeqno feature negotiated, a mutation's answer carries the vbucket uuid and
the seqno the mutation got, which a client uses with ObserveSeqno or as a DCP resume point.
"""

from __future__ import annotations

from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine import document
from dcpkv.engine.bucket import StateCasMismatch
from dcpkv.engine.document import CompressionMode
from dcpkv.engine.item import EngineError, Item, KeyNotFound
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import kv
from dcpkv.protocol.base import GenericResponse
from dcpkv.protocol.constants import Datatype, HelloFeature, Opcode
from dcpkv.server import datatype
from dcpkv.server.connection import Connection, Reply, not_my_vbucket
from dcpkv.server.session import ok

_QUIET = frozenset(
    {Opcode.GetQ, Opcode.GetKQ, Opcode.SetQ, Opcode.AddQ, Opcode.ReplaceQ, Opcode.DeleteQ}
)
_WITH_KEY = frozenset({Opcode.GetK, Opcode.GetKQ})
_ADD = frozenset({Opcode.Add, Opcode.AddQ})
_SET = frozenset({Opcode.Set, Opcode.SetQ})


# -- helpers -----------------------------------------------------------------------------------


def refusal(conn: Connection, exc: EngineError) -> Reply:
    status = exc.status
    if status == Status.NotMyVbucket:
        return not_my_vbucket(conn)
    if isinstance(exc, StateCasMismatch):  # the current state CAS, so the manager can retry
        return Reply(status, str(exc).encode(), cas=exc.cas)
    return Reply(status)


def active(conn: Connection, vb: int) -> VBucket:
    """The vbucket, if this node holds it active; otherwise NotMyVbucket."""
    vbucket = conn.bucket.vbuckets.get(vb)
    if vbucket is None or vbucket.state != VBucketState.ACTIVE:
        raise not_my_vbucket(conn)
    return vbucket


def present(conn: Connection, vb: int) -> VBucket:
    vbucket = conn.bucket.vbuckets.get(vb)
    if vbucket is None:
        raise not_my_vbucket(conn)
    return vbucket


_NOT_JSON = 0xFF & ~int(Datatype.JSON)  # a plain int: IntFlag arithmetic is slow on a hot path
_SHAPED = document.SHAPED
_ACTIVE = CompressionMode.ACTIVE


def _incoming(conn: Connection, req: kv.Set | kv.Append) -> tuple[bytes, int]:
    """The (value, datatype) to store; plain values with no compression to do pass as they are."""
    value, dt = bytes(req.value), req.datatype
    if dt & _NOT_JSON or conn.bucket.compression_mode is _ACTIVE:
        return datatype.accept(conn, value, dt)
    return value, dt


def mutated(
    conn: Connection, req: kv.Request, vbucket: VBucket, item: Item
) -> kv.MutationResponse | None:
    if req.opcode in _QUIET:
        return None
    return mutation_answer(conn, kv.MUTATION_RESPONSES[req.opcode], req, vbucket, item)


def mutation_answer(
    conn: Connection, answer_type: type[kv.MutationResponse], req: kv.Request, vbucket: VBucket,
    item: Item,
) -> kv.MutationResponse:  # fmt: skip
    """A mutation's success: its CAS, and with MutationSeqno the vbucket uuid and seqno."""
    answer = answer_type(opaque=req.opaque, cas=item.cas)
    if HelloFeature.MutationSeqno in conn.features:
        answer.vbucket_uuid, answer.seqno = vbucket.uuid, item.by_seqno
    return answer


# -- get ---------------------------------------------------------------------------------------


def get(conn: Connection, req: kv.Get) -> kv.GetResponse | GenericResponse | None:
    vbucket = active(conn, req.vbucket)
    key = bytes(req.key)  # frames are views of the read buffer: never keep one
    op = req.opcode
    try:
        item = vbucket.get(key)
    except KeyNotFound:
        if op in _QUIET:
            return None
        missing = GenericResponse(opcode=op, opaque=req.opaque, status=Status.KeyEnoent)
        if op in _WITH_KEY:
            missing.key = key
        return missing
    except EngineError as exc:
        raise refusal(conn, exc) from None
    if item.datatype & _SHAPED:
        value, dt = datatype.for_client(conn, item)
    else:
        value, dt = item.value or b"", item.datatype
    hit = kv.GET_RESPONSES[op](opaque=req.opaque, cas=item.cas, flags=item.flags, value=value)
    hit.datatype = dt & conn.datatype_mask  # only the bits the client negotiated
    if op in _WITH_KEY:
        hit.key = key
    return hit


# -- stores ------------------------------------------------------------------------------------


def store(conn: Connection, req: kv.Set) -> kv.MutationResponse | None:
    vbucket = active(conn, req.vbucket)
    value, dt = _incoming(conn, req)
    key, op = bytes(req.key), req.opcode
    try:
        if op in _SET:
            item = vbucket.set(key, value, flags=req.flags, expiry=req.expiration, cas=req.cas,
                               datatype=dt)  # fmt: skip
        elif op in _ADD:
            if req.cas:
                raise Reply(Status.Einval, b"Add takes no CAS")
            item = vbucket.add(key, value, flags=req.flags, expiry=req.expiration,
                               datatype=dt)  # fmt: skip
        else:
            item = vbucket.replace(key, value, flags=req.flags, expiry=req.expiration,
                                   cas=req.cas, datatype=dt)  # fmt: skip
    except EngineError as exc:
        raise refusal(conn, exc) from None
    return mutated(conn, req, vbucket, item)


def delete(conn: Connection, req: kv.Delete) -> kv.MutationResponse | None:
    vbucket = active(conn, req.vbucket)
    try:
        item = vbucket.delete(bytes(req.key), cas=req.cas)
    except EngineError as exc:
        raise refusal(conn, exc) from None
    return mutated(conn, req, vbucket, item)


def concat(conn: Connection, req: kv.Append) -> kv.MutationResponse | None:
    vbucket = active(conn, req.vbucket)
    value, dt = _incoming(conn, req)
    if dt & _SHAPED:  # the engine appends plain bytes to the body
        if dt & document.XATTR:
            raise Reply(Status.Einval, b"append/prepend take no xattrs")
        value, dt = document.inflate(value, dt)
    op = vbucket.append if req.opcode == Opcode.Append else vbucket.prepend
    try:
        item = op(bytes(req.key), value, cas=req.cas)
    except EngineError as exc:
        raise refusal(conn, exc) from None
    return mutated(conn, req, vbucket, item)


def arith(conn: Connection, req: kv.Increment) -> kv.IncrementResponse:
    vbucket = active(conn, req.vbucket)
    op = vbucket.incr if req.opcode == Opcode.Increment else vbucket.decr
    try:
        number, item = op(
            bytes(req.key), req.delta, initial=req.initial, expiry=req.expiration, cas=req.cas
        )
    except EngineError as exc:
        raise refusal(conn, exc) from None
    answer_type = kv.IncrementResponse if req.opcode == Opcode.Increment else kv.DecrementResponse
    answer = answer_type(opaque=req.opaque, cas=item.cas, counter=number)
    if HelloFeature.MutationSeqno in conn.features:
        answer.vbucket_uuid, answer.seqno = vbucket.uuid, item.by_seqno
    return answer


def touch(conn: Connection, req: kv.Touch) -> kv.MutationResponse | kv.GetResponse:
    vbucket = active(conn, req.vbucket)
    try:
        item = vbucket.touch(bytes(req.key), req.expiration)
    except EngineError as exc:
        raise refusal(conn, exc) from None
    if req.opcode == Opcode.Touch:
        return kv.TouchResponse(opaque=req.opaque, cas=item.cas)
    value, dt = datatype.for_client(conn, item)
    return kv.GATResponse(opaque=req.opaque, cas=item.cas, datatype=dt, flags=item.flags,
                          value=value)  # fmt: skip


# -- flush -------------------------------------------------------------------------------------


def flush(conn: Connection, req: kv.Flush) -> GenericResponse:
    if req.delay:
        raise Reply(Status.NotSupported, b"delayed flush is not supported")
    try:
        conn.bucket.delete_all()
    except EngineError as exc:
        # (TempFail, a full quota...) stops the flush with that status; what it deleted stays
        # deleted, and the client may send it again
        raise refusal(conn, exc) from None
    return ok(req)


# -- observe -----------------------------------------------------------------------------------


def get_meta(conn: Connection, req: kv.GetMeta) -> kv.GetMetaResponse | None:
    """Metadata of the key's current version, a tombstone's too (deleted = 1); KeyEnoent
    when the key never existed or its tombstone was purged (GetqMeta: no answer then)."""
    vbucket = active(conn, req.vbucket)
    try:
        item = vbucket.get_meta(bytes(req.key))
    except EngineError as exc:
        raise refusal(conn, exc) from None
    quiet = req.opcode == Opcode.GetqMeta
    if item is None:
        if quiet:
            return None
        raise Reply(Status.KeyEnoent)
    answer_type = kv.GetqMetaResponse if quiet else kv.GetMetaResponse
    return answer_type(
        opaque=req.opaque, cas=item.cas, deleted=item.deleted, flags=item.flags,
        expiry=item.expiry, rev_seqno=item.rev_seqno,
        item_datatype=item.datatype & conn.datatype_mask if req.version == 2 else None,
    )  # fmt: skip


def observe_seqno(conn: Connection, req: kv.ObserveSeqno) -> kv.ObserveSeqnoResponse:
    vbucket = present(conn, req.vbucket)
    if vbucket.state == VBucketState.DEAD:
        raise not_my_vbucket(conn)
    with vbucket.lock:
        entries = vbucket.failover.entries
        persisted, current = vbucket.persisted_seqno, vbucket.high_seqno
    if persisted < current:
        # Someone polls for persistence: the flusher writes this bucket's backlog at its next
        # tick, however sparse (engine/flush_cadence.py, case W).
        conn.bucket.want_persistence()
    answer = kv.ObserveSeqnoResponse(
        opaque=req.opaque, vbucket=req.vbucket, vbucket_uuid=req.vbucket_uuid,
        last_persisted_seqno=persisted, current_seqno=current,
    )  # fmt: skip
    if entries[0].uuid == req.vbucket_uuid:
        return answer
    index = next((i for i, e in enumerate(entries) if e.uuid == req.vbucket_uuid), None)
    if index is None:
        raise Reply(Status.KeyEnoent, b"vbucket uuid not in the failover log")
    # A hard failover since that uuid (format 1): the current uuid, and where the old branch
    # ended, which is where the next newer branch began.
    answer.vbucket_uuid, answer.old_vbucket_uuid = entries[0].uuid, req.vbucket_uuid
    answer.last_received_seqno = entries[index - 1].seqno
    return answer

"""Key-value opcodes: the memcached operations, stats, vbucket control, ObserveSeqno.

Theory of operation
-------------------
Each handler decodes one request frame, calls the engine (:mod:`dcpkv.engine`) and encodes the
answer; importing this module registers them in :data:`dcpkv.server.connection.HANDLERS`.
Handlers run on the event loop: the vbucket operations are in-memory and take only the
vbucket's short lock, so they never wait for the flusher thread.

Errors: an engine refusal is an :class:`EngineError` whose ``status`` names the memcached
status; :func:`_engine` turns it into a :class:`Reply` with that status (NotMyVbucket carries
the cluster map so a smart client re-routes). A request is validated (extras length, vbucket
state, datatype) before the engine sees it, so a rejected request writes nothing.

Quiet opcodes (GetQ, GetKQ, SetQ, ...) answer nothing on the common outcome (a miss for the
quiet gets, success for the quiet mutations); the client learns the rest with a Noop.

Flush deletes every live key of the bucket's active vbuckets through the ordinary delete path,
so each gets a tombstone with a seqno: DCP consumers and the flusher see the deletions like any
others (a wholesale "truncate" would leave consumers holding keys the bucket no longer has).
It runs on the event loop, one vbucket's lock at a time, so it is O(items) and meant for tests
and small buckets, as in Couchbase, where flush is an admin operation off by default.

With the MutationSeqno feature negotiated, a mutation's answer carries 16 bytes of extras,
the vbucket uuid and the seqno the mutation got, which a client uses with ObserveSeqno or as
a DCP resume point.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from dcpkv import __version__
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.item import EngineError, Item
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol.constants import Datatype, HelloFeature, Opcode
from dcpkv.protocol.frame import Frame
from dcpkv.server.connection import Connection, Reply, handler, not_my_vbucket, response

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_FLAGS_EXPIRY = struct.Struct(">II")
_ARITH = struct.Struct(">QQI")
_TOKEN = struct.Struct(">QQ")
_VB_SEQNO = struct.Struct(">HQ")
_OBSERVE = struct.Struct(">BHQQQ")
_OBSERVE_FAILOVER = struct.Struct(">BHQQQQQ")

_QUIET = frozenset(
    {Opcode.GetQ, Opcode.GetKQ, Opcode.SetQ, Opcode.AddQ, Opcode.ReplaceQ, Opcode.DeleteQ}
)
STARTED = time.time()

T = TypeVar("T")


# -- helpers -----------------------------------------------------------------------------------


def _engine(conn: Connection, op: Callable[[], T]) -> T:
    try:
        return op()
    except EngineError as exc:
        status = exc.status
        if status == Status.NotMyVbucket:
            raise not_my_vbucket(conn) from None
        raise Reply(status) from None


def _active(conn: Connection, frame: Frame) -> VBucket:
    """The request's vbucket, if this node holds it active; otherwise NotMyVbucket."""
    vbucket = conn.bucket.vbuckets.get(frame.vbucket)
    if vbucket is None or vbucket.state != VBucketState.ACTIVE:
        raise not_my_vbucket(conn)
    return vbucket


def _present(conn: Connection, frame: Frame) -> VBucket:
    vbucket = conn.bucket.vbuckets.get(frame.vbucket)
    if vbucket is None:
        raise not_my_vbucket(conn)
    return vbucket


def _extras(frame: Frame, *sizes: int) -> bytes:
    if len(frame.extras) not in sizes:
        raise Reply(Status.Einval, f"extras must be {' or '.join(map(str, sizes))} bytes".encode())
    return bytes(frame.extras)


def _key(frame: Frame) -> bytes:
    if not frame.key:
        raise Reply(Status.Einval, b"a key is required")
    # Frames are views of the read buffer: the engine must keep a copy, not a view.
    return bytes(frame.key)


def _no_value(frame: Frame) -> None:
    if frame.value:
        raise Reply(Status.Einval, b"this opcode takes no value")


def _datatype(conn: Connection, frame: Frame) -> int:
    """The datatype to store: only JSON is understood; Snappy and Xattr are not negotiated."""
    if frame.datatype & ~Datatype.JSON:
        raise Reply(Status.Einval, b"datatype not negotiated")
    return frame.datatype


def _out_datatype(conn: Connection, item: Item) -> int:
    # A client that did not negotiate Datatype must see raw (0) values.
    return item.datatype if HelloFeature.Datatype in conn.features else 0


def _token(conn: Connection, vbucket: VBucket, item: Item) -> bytes:
    if HelloFeature.MutationSeqno not in conn.features:
        return b""
    return _TOKEN.pack(vbucket.uuid, item.by_seqno)


def _mutated(conn: Connection, frame: Frame, vbucket: VBucket, item: Item) -> bytes | None:
    if frame.opcode in _QUIET:
        return None
    return response(frame, extras=_token(conn, vbucket, item), cas=item.cas)


# -- get ---------------------------------------------------------------------------------------


@handler(Opcode.Get, Opcode.GetQ, Opcode.GetK, Opcode.GetKQ)
def _get(conn: Connection, frame: Frame) -> bytes | None:
    _extras(frame, 0)
    key = _key(frame)
    vbucket = _active(conn, frame)
    with_key = frame.opcode in (Opcode.GetK, Opcode.GetKQ)
    try:
        item = _engine(conn, lambda: vbucket.get(key))
    except Reply as reply:
        if reply.status == Status.KeyEnoent:
            if frame.opcode in _QUIET:
                return None
            return response(frame, Status.KeyEnoent, key=key if with_key else b"")
        raise
    return response(
        frame,
        key=key if with_key else b"",
        extras=_U32.pack(item.flags),
        value=item.value or b"",
        cas=item.cas,
        datatype=_out_datatype(conn, item),
    )


# -- stores ------------------------------------------------------------------------------------


@handler(Opcode.Set, Opcode.SetQ, Opcode.Add, Opcode.AddQ, Opcode.Replace, Opcode.ReplaceQ)
def _store(conn: Connection, frame: Frame) -> bytes | None:
    flags, expiry = _FLAGS_EXPIRY.unpack(_extras(frame, 8))
    key = _key(frame)
    datatype = _datatype(conn, frame)
    vbucket = _active(conn, frame)
    value = bytes(frame.value)
    op = frame.opcode
    if op in (Opcode.Add, Opcode.AddQ):
        if frame.cas:
            raise Reply(Status.Einval, b"Add takes no CAS")
        item = _engine(
            conn,
            lambda: vbucket.add(key, value, flags=flags, expiry=expiry, datatype=datatype),
        )
    else:
        store = vbucket.set if op in (Opcode.Set, Opcode.SetQ) else vbucket.replace
        item = _engine(
            conn,
            lambda: store(key, value, flags=flags, expiry=expiry, cas=frame.cas, datatype=datatype),
        )
    return _mutated(conn, frame, vbucket, item)


@handler(Opcode.Delete, Opcode.DeleteQ)
def _delete(conn: Connection, frame: Frame) -> bytes | None:
    _extras(frame, 0)
    _no_value(frame)
    key = _key(frame)
    vbucket = _active(conn, frame)
    item = _engine(conn, lambda: vbucket.delete(key, cas=frame.cas))
    return _mutated(conn, frame, vbucket, item)


@handler(Opcode.Append, Opcode.Prepend)
def _concat(conn: Connection, frame: Frame) -> bytes | None:
    _extras(frame, 0)
    key = _key(frame)
    _datatype(conn, frame)
    vbucket = _active(conn, frame)
    value = bytes(frame.value)
    op = vbucket.append if frame.opcode == Opcode.Append else vbucket.prepend
    item = _engine(conn, lambda: op(key, value, cas=frame.cas))
    return _mutated(conn, frame, vbucket, item)


@handler(Opcode.Increment, Opcode.Decrement)
def _arith(conn: Connection, frame: Frame) -> bytes:
    delta, initial, expiry = _ARITH.unpack(_extras(frame, 20))
    _no_value(frame)
    key = _key(frame)
    vbucket = _active(conn, frame)
    op = vbucket.incr if frame.opcode == Opcode.Increment else vbucket.decr
    number, item = _engine(
        conn, lambda: op(key, delta, initial=initial, expiry=expiry, cas=frame.cas)
    )
    return response(
        frame, extras=_token(conn, vbucket, item), value=_U64.pack(number), cas=item.cas
    )


@handler(Opcode.Touch, Opcode.GAT)
def _touch(conn: Connection, frame: Frame) -> bytes:
    (expiry,) = _U32.unpack(_extras(frame, 4))
    _no_value(frame)
    key = _key(frame)
    vbucket = _active(conn, frame)
    item = _engine(conn, lambda: vbucket.touch(key, expiry))
    if frame.opcode == Opcode.Touch:
        return response(frame, cas=item.cas)
    return response(
        frame,
        extras=_U32.pack(item.flags),
        value=item.value or b"",
        cas=item.cas,
        datatype=_out_datatype(conn, item),
    )


# -- flush -------------------------------------------------------------------------------------


@handler(Opcode.Flush)
def _flush(conn: Connection, frame: Frame) -> bytes:
    raw = _extras(frame, 0, 4)
    if raw and _U32.unpack(raw)[0]:
        raise Reply(Status.NotSupported, b"delayed flush is not supported")
    _no_value(frame)
    if frame.key:
        raise Reply(Status.Einval, b"Flush takes no key")
    for vbucket in list(conn.bucket.vbuckets.values()):
        if vbucket.state == VBucketState.ACTIVE:
            _flush_vbucket(conn, vbucket)
    return response(frame)


def _flush_vbucket(conn: Connection, vbucket: VBucket) -> None:
    for item in vbucket.items():
        if item.deleted:
            continue
        try:
            _engine(conn, lambda key=item.key: vbucket.delete(key))
        except Reply as reply:
            # Gone meanwhile (expired when touched) is fine; anything else (TempFail, a state
            # change) stops the flush with that status, and the client may send it again.
            if reply.status != Status.KeyEnoent:
                raise


# -- stats -------------------------------------------------------------------------------------


@handler(Opcode.Stat)
def _stat(conn: Connection, frame: Frame) -> bytes:
    group, _, arg = bytes(frame.key).decode("ascii", "replace").partition(" ")
    groups: dict[str, Callable[[Connection, str], Iterator[tuple[str, object]]]] = {
        "": _general_stats,
        "vbucket-seqno": _seqno_stats,
        "failovers": _failover_stats,
        "vbucket": _vbucket_stats,
    }
    stats = groups.get(group)
    if stats is None:
        raise Reply(Status.KeyEnoent, f"no stat group {group!r}".encode())
    parts = [
        response(frame, key=name.encode(), value=str(value).encode())
        for name, value in stats(conn, arg.strip())
    ]
    parts.append(response(frame))  # an empty key ends the answer
    return b"".join(parts)


def _selected(conn: Connection, arg: str) -> list[VBucket]:
    vbuckets = conn.bucket.vbuckets
    if not arg:
        return [vbuckets[vb] for vb in sorted(vbuckets)]
    if not arg.isdigit():
        raise Reply(Status.Einval, b"the stat argument must be a vbucket number")
    vbucket = vbuckets.get(int(arg))
    if vbucket is None:
        raise not_my_vbucket(conn)
    return [vbucket]


def _general_stats(conn: Connection, arg: str) -> Iterator[tuple[str, object]]:
    bucket = conn.bucket
    vbuckets = list(bucket.vbuckets.values())
    now = time.time()
    yield "pid", os.getpid()
    yield "uptime", int(now - STARTED)
    yield "time", int(now)
    yield "version", __version__
    yield "curr_connections", conn.server.connections
    yield "curr_items", sum(len(vb) for vb in vbuckets if vb.state == VBucketState.ACTIVE)
    yield "mem_used", bucket.memory_used
    yield "ep_max_size", bucket.memory_quota
    for state in VBucketState:
        yield f"vb_{state.label}_num", sum(1 for vb in vbuckets if vb.state == state)


def _seqno_stats(conn: Connection, arg: str) -> Iterator[tuple[str, object]]:
    for vb in _selected(conn, arg):
        yield f"vb_{vb.id}:high_seqno", vb.high_seqno
        yield f"vb_{vb.id}:abs_high_seqno", vb.high_seqno
        yield f"vb_{vb.id}:purge_seqno", vb.purge_seqno
        yield f"vb_{vb.id}:uuid", vb.uuid


def _failover_stats(conn: Connection, arg: str) -> Iterator[tuple[str, object]]:
    for vb in _selected(conn, arg):
        entries = vb.failover.entries
        yield f"vb_{vb.id}:num_entries", len(entries)
        for i, entry in enumerate(entries):
            yield f"vb_{vb.id}:{i}:id", entry.uuid
            yield f"vb_{vb.id}:{i}:seq", entry.seqno


def _vbucket_stats(conn: Connection, arg: str) -> Iterator[tuple[str, object]]:
    for vb in _selected(conn, arg):
        yield f"vb_{vb.id}", vb.state.label


# -- vbucket control ---------------------------------------------------------------------------


def _wire_state(raw: bytes) -> VBucketState:
    (code,) = _U32.unpack(raw)
    try:
        return VBucketState(code)
    except ValueError:
        raise Reply(Status.Einval, f"unknown vbucket state {code}".encode()) from None


@handler(Opcode.SetVbucket)
def _set_vbucket(conn: Connection, frame: Frame) -> bytes:
    state = _wire_state(_extras(frame, 4))
    if not 0 <= frame.vbucket < conn.bucket.num_vbuckets:
        raise Reply(Status.Einval, b"vbucket id out of range")
    _engine(conn, lambda: conn.bucket.set_vbucket_state(frame.vbucket, state))
    return response(frame)


@handler(Opcode.GetVbucket)
def _get_vbucket(conn: Connection, frame: Frame) -> bytes:
    vbucket = _present(conn, frame)
    return response(frame, value=_U32.pack(vbucket.state))


@handler(Opcode.DelVbucket)
def _del_vbucket(conn: Connection, frame: Frame) -> bytes:
    _present(conn, frame)
    # Storage I/O on the loop: rare and admin-only; the bucket's I/O lock orders it
    # against the flusher thread.
    _engine(conn, lambda: conn.bucket.delete_vbucket(frame.vbucket))
    return response(frame)


@handler(Opcode.GetAllVbSeqnos)
def _all_vb_seqnos(conn: Connection, frame: Frame) -> bytes:
    raw = _extras(frame, 0, 4)
    wanted = {_wire_state(raw)} if raw and _U32.unpack(raw)[0] else None
    vbuckets = conn.bucket.vbuckets
    pairs = [
        _VB_SEQNO.pack(vb, vbuckets[vb].high_seqno)
        for vb in sorted(vbuckets)
        if (vbuckets[vb].state in wanted if wanted else vbuckets[vb].state != VBucketState.DEAD)
    ]
    return response(frame, value=b"".join(pairs))


@handler(Opcode.ObserveSeqno)
def _observe_seqno(conn: Connection, frame: Frame) -> bytes:
    if len(frame.value) != 8:
        raise Reply(Status.Einval, b"ObserveSeqno wants an 8-byte vbucket uuid")
    (uuid,) = _U64.unpack(frame.value)
    vbucket = _present(conn, frame)
    if vbucket.state == VBucketState.DEAD:
        raise not_my_vbucket(conn)
    with vbucket.lock:
        entries = vbucket.failover.entries
        persisted, current = vbucket.persisted_seqno, vbucket.high_seqno
    if entries[0].uuid == uuid:
        value = _OBSERVE.pack(0, frame.vbucket, uuid, persisted, current)
        return response(frame, value=value)
    index = next((i for i, e in enumerate(entries) if e.uuid == uuid), None)
    if index is None:
        raise Reply(Status.KeyEnoent, b"vbucket uuid not in the failover log")
    # The old branch ended where the next newer branch began.
    last_received = entries[index - 1].seqno
    value = _OBSERVE_FAILOVER.pack(
        1, frame.vbucket, entries[0].uuid, persisted, current, uuid, last_received
    )
    return response(frame, value=value)

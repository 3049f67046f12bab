"""Typed DCP messages (opcodes 0x50-0x66).

Theory of operation
-------------------
Producer-to-consumer messages (markers, mutations, deletions, stream ends ...) are requests
with magic 0x80, or 0x08 when a DCP stream id is carried in the framing extras; they carry the
stream request's opaque and the vbucket in the header. Consumer-to-producer control messages
(Open, StreamRequest, BufferAck, Control ...) are requests too. Their answers are responses:
typed when the body means something (AddStream's new opaque, the stream request's failover
log or rollback seqno, GetFailoverLog's log), otherwise :class:`GenericResponse`.

Two opcodes have several layouts, told apart by the extras:

* SnapshotMarker: 20 bytes of extras = V1; 1 byte = V2, whose value byte picks V2.0 (36-byte
  value) or V2.2 (52-byte value: V2.0 + purge seqno + high prepared seqno, as PROTOCOL.md
  lays it out). ``SnapshotMarkerV2_2`` subclasses ``SnapshotMarkerV2_0`` which subclasses
  ``SnapshotMarker``, so ``isinstance(m, SnapshotMarker)`` catches every version.
* Deletion: 18 bytes = V1 (with nmeta), 21 bytes = V2 (with a delete time).

Failover-log bodies are read and written by ``dcpkv.core.failover_table`` (one definition
of the 16-byte entry); its errors become ``CodecError(Einval)`` here.

Mutation is the hot path of every stream and is written out by hand: one precompiled
``struct`` pack of header plus extras then a concatenation to encode; one unpack of the extras
and memoryview slices (made by the parser) to decode. A producer that holds the fields already
(a stored row, an item) skips the message object: :func:`encode_mutation` is the same bytes as
``Mutation(...).encode()`` for a request without a stream id, and :data:`MUTATION_HEAD_S64` packs
a CAS kept as a signed 64-bit integer (storage's form) to the very same bytes as the u64.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Self

from dcpkv.core.failover_table import FailoverEntry, FailoverTableError, decode_wire, encode_wire
from dcpkv.core.seqno import U64_MAX
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol.base import (
    Message,
    Part,
    Request,
    Response,
    ValueCodec,
    check_frame,
    einval,
    generic_fields,
    generic_parts,
    key_field,
    pack,
    unpack_exact,
)
from dcpkv.protocol.constants import (
    MAX_DCP_NAME_LEN,
    MAX_KEY_LEN,
    Magic,
    Opcode,
    SnapshotMarkerVersion,
    StreamEndReason,
)
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import HEADER, Bytes, Frame

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_OPEN = struct.Struct(">II")
_STREAM_REQUEST = struct.Struct(">IIQQQQQ")
_MARKER_V1 = struct.Struct(">QQI")
_MARKER_V2_0 = struct.Struct(">QQIQQ")
_MARKER_V2_2 = struct.Struct(">QQIQQQQ")
_MUTATION_EXTRAS = struct.Struct(">QQIIIHB")
_MUTATION_EXTRAS_LEN = _MUTATION_EXTRAS.size  # 31
# header and extras of a mutation in one pack: the whole encode is one call plus a join
_MUTATION_HEAD = struct.Struct(HEADER.format + _MUTATION_EXTRAS.format[1:])
# the same layout with the CAS as a signed 64-bit field: two's complement gives the u64's bytes
MUTATION_HEAD_S64 = struct.Struct(HEADER.format[:-1] + "q" + _MUTATION_EXTRAS.format[1:])
MUTATION_EXTRAS_LEN = _MUTATION_EXTRAS_LEN
_REQUEST_MAGIC, _MUTATION_OPCODE = int(Magic.ClientRequest), int(Opcode.DcpMutation)
_MARKER_OPCODE = int(Opcode.DcpSnapshotMarker)
_REQUEST_MAGICS = frozenset(
    int(m) for m in (Magic.ClientRequest, Magic.AltClientRequest, Magic.ServerRequest)
)
_UNPACK_EXTRAS = _MUTATION_EXTRAS.unpack
_new = object.__new__
_MARKER_V1_HEAD = struct.Struct(HEADER.format + _MARKER_V1.format[1:])
_DELETION_V1 = struct.Struct(">QQH")
_DELETION_V2 = struct.Struct(">QQIB")
_EXPIRATION = struct.Struct(">QQI")
_SYSTEM_EVENT = struct.Struct(">QIB")
_PREPARE = struct.Struct(">QQIIIBBB")
_TWO_SEQNOS = struct.Struct(">QQ")
_REASON_BY_VALUE = {r.value: r for r in StreamEndReason}


def _failover_body(entries: tuple[FailoverEntry, ...], what: str) -> bytes:
    if not entries:
        raise einval(what, "a failover log has at least one entry")
    try:
        return encode_wire(entries)
    except struct.error as exc:
        raise einval(what, f"an entry is out of the u64 range ({exc})") from None


def _failover_log(body: Bytes, what: str) -> tuple[FailoverEntry, ...]:
    try:
        return tuple(decode_wire(body))
    except FailoverTableError as exc:
        raise einval(what, str(exc)) from None


FAILOVER_LOG = ValueCodec(_failover_body, _failover_log)


# -- connection ------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class DcpOpen(Request):
    """Key = connection name (at most 200 bytes); ``flags`` are :class:`OpenFlag` bits; an
    optional value (JSON) is kept raw."""

    OPCODE = Opcode.DcpOpen
    EXTRAS = _OPEN
    EXTRAS_FIELDS = ("seqno", "flags")
    KEY = Part.REQUIRED
    KEY_FIELD = "name"
    KEY_TEXT = True
    VALUE = Part.OPTIONAL
    name: str
    flags: int = 0
    seqno: int = 0
    value: Bytes = b""

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        extras, key, value = generic_parts(self)
        _check_name_len(len(key))
        return extras, key, value

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        _check_name_len(len(frame.key))
        return generic_fields(cls, frame)


def _check_name_len(length: int) -> None:
    if length > MAX_DCP_NAME_LEN:
        raise einval("DcpOpen name", f"{length} bytes exceeds {MAX_DCP_NAME_LEN}")


@dataclass(slots=True, kw_only=True)
class DcpControl(Request):
    """Key = setting name, value = setting value (e.g. ``enable_noop`` = ``true``)."""

    OPCODE = Opcode.DcpControl
    KEY = Part.REQUIRED
    KEY_TEXT = True
    VALUE = Part.OPTIONAL
    VALUE_TEXT = True
    key: str
    value: str = ""


@dataclass(slots=True, kw_only=True)
class DcpNoop(Request):
    OPCODE = Opcode.DcpNoop


@dataclass(slots=True, kw_only=True)
class BufferAck(Request):
    OPCODE = Opcode.DcpBufferAck
    EXTRAS = _U32
    EXTRAS_FIELDS = ("bytes_acked",)
    bytes_acked: int = 0


@dataclass(slots=True, kw_only=True)
class DcpBarrier(Request):
    """This project's barrier cookie (see ``constants``): the consumer sends it with
    ``echo=False`` (magic 0x80); the producer returns it with ``echo=True`` (magic 0x82), same
    cookie and opaque, once every stream has sent all it had when the cookie arrived."""

    OPCODE = Opcode.DcpBarrier
    KEY = Part.REQUIRED
    KEY_FIELD = "cookie"
    cookie: Bytes
    echo: bool = False

    def _magic(self) -> int:
        return Magic.ServerRequest if self.echo else Magic.ClientRequest

    def encode(self) -> bytes:
        if self.echo and self.stream_id is not None:
            raise einval("DcpBarrier stream_id", "an echoed barrier (0x82) has no framing extras")
        return Request.encode(self)

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        fields = generic_fields(cls, frame)
        fields["echo"] = frame.magic == Magic.ServerRequest
        return fields


# -- streams ---------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class AddStream(Request):
    OPCODE = Opcode.DcpAddStream
    EXTRAS = _U32
    EXTRAS_FIELDS = ("flags",)
    flags: int = 0


@dataclass(slots=True, kw_only=True)
class AddStreamResponse(Response):
    """Extras = the opaque the new stream's messages will carry."""

    OPCODE = Opcode.DcpAddStream
    EXTRAS = _U32
    EXTRAS_FIELDS = ("stream_opaque",)
    stream_opaque: int = 0


@dataclass(slots=True, kw_only=True)
class CloseStream(Request):
    OPCODE = Opcode.DcpCloseStream


def stream_request_value(purge_seqno: int | None = None, **other: Any) -> bytes:
    """The JSON value of a stream request; the purge seqno travels as a decimal string."""
    doc = dict(other)
    if purge_seqno is not None:
        doc["purge_seqno"] = str(purge_seqno)
    return json.dumps(doc, separators=(",", ":")).encode() if doc else b""


def _purge_seqno(doc: dict[str, Any]) -> int | None:
    raw = doc.get("purge_seqno")
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.isascii() or not raw.isdigit():
        raise einval("StreamRequest purge_seqno", f"{raw!r} is not a decimal string")
    seqno = int(raw)
    if seqno > U64_MAX:
        raise einval("StreamRequest purge_seqno", f"{raw} is outside the u64 range")
    return seqno


def _stream_request_doc(value: Bytes) -> dict[str, Any]:
    try:
        doc = json.loads(bytes(value))
    except (ValueError, RecursionError):
        raise einval("StreamRequest value", "is not valid JSON") from None
    if not isinstance(doc, dict):
        raise einval("StreamRequest value", "must be a JSON object")
    return doc


@dataclass(slots=True, kw_only=True)
class StreamRequest(Request):
    """48-byte extras; the optional value is a JSON object such as ``{"purge_seqno":"123"}``
    (build it with :func:`stream_request_value`), checked on decode and kept raw."""

    OPCODE = Opcode.DcpStreamRequest
    EXTRAS = _STREAM_REQUEST
    EXTRAS_FIELDS = (
        "flags", "reserved", "start_seqno", "end_seqno", "vbucket_uuid",
        "snap_start_seqno", "snap_end_seqno",
    )  # fmt: skip
    VALUE = Part.OPTIONAL
    flags: int = 0
    reserved: int = 0
    start_seqno: int = 0
    end_seqno: int = U64_MAX
    vbucket_uuid: int = 0
    snap_start_seqno: int = 0
    snap_end_seqno: int = 0
    value: Bytes = b""

    @property
    def purge_seqno(self) -> int | None:
        """The consumer's purge seqno from the JSON value, if it sent one."""
        return _purge_seqno(_stream_request_doc(self.value)) if self.value else None

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        fields = generic_fields(cls, frame)
        if frame.value:
            _purge_seqno(_stream_request_doc(frame.value))
        return fields


@dataclass(slots=True, kw_only=True)
class StreamRequestOk(Response):
    """Success: the body is the producer's failover log, newest first."""

    OPCODE = Opcode.DcpStreamRequest
    VALUE_FIELD = "failover_log"
    VALUE_CODEC = FAILOVER_LOG
    failover_log: tuple[FailoverEntry, ...] = ()


@dataclass(slots=True, kw_only=True)
class StreamRequestRollback(Response):
    """Status Rollback: roll back to (at most) ``rollback_seqno`` and ask again."""

    OPCODE = Opcode.DcpStreamRequest
    STATUSES = frozenset({Status.Rollback})
    VALUE_STRUCT = _U64
    VALUE_FIELDS = ("rollback_seqno",)
    status: int = Status.Rollback
    rollback_seqno: int = 0


@dataclass(slots=True, kw_only=True)
class GetFailoverLog(Request):
    OPCODE = Opcode.DcpGetFailoverLog


@dataclass(slots=True, kw_only=True)
class GetFailoverLogResponse(Response):
    OPCODE = Opcode.DcpGetFailoverLog
    VALUE_FIELD = "failover_log"
    VALUE_CODEC = FAILOVER_LOG
    failover_log: tuple[FailoverEntry, ...] = ()


@dataclass(slots=True, kw_only=True)
class StreamEnd(Request):
    """``reason`` is a :class:`StreamEndReason` when known, the raw u32 otherwise."""

    OPCODE = Opcode.DcpStreamEnd
    EXTRAS = _U32
    EXTRAS_FIELDS = ("reason",)
    reason: int = StreamEndReason.OK

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        fields = generic_fields(cls, frame)
        fields["reason"] = _REASON_BY_VALUE.get(fields["reason"], fields["reason"])
        return fields


@dataclass(slots=True, kw_only=True)
class SetVbucketState(Request):
    OPCODE = Opcode.DcpSetVbucketState
    EXTRAS = _U8
    EXTRAS_FIELDS = ("state",)
    state: int = VBucketState.ACTIVE

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        fields = generic_fields(cls, frame)
        try:
            fields["state"] = VBucketState(fields["state"])
        except ValueError:
            raise einval("SetVbucketState state", f"{fields['state']} is not 1-4") from None
        return fields


# -- snapshot markers ------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class SnapshotMarker(Request):
    """V1 marker: 20-byte extras (start, end, flags), no key, no value. ``flags`` are
    :class:`SnapshotFlag` bits."""

    OPCODE = Opcode.DcpSnapshotMarker
    EXTRAS = _MARKER_V1
    EXTRAS_FIELDS = ("start_seqno", "end_seqno", "flags")
    start_seqno: int = 0
    end_seqno: int = 0
    flags: int = 0


# typed as a tuple of any length: V2.2 extends it
_MARKER_V2_0_NAMES: tuple[str, ...] = (
    "start_seqno", "end_seqno", "flags", "max_visible_seqno", "high_completed_seqno",
)  # fmt: skip


@dataclass(slots=True, kw_only=True)
class SnapshotMarkerV2_0(SnapshotMarker):
    """V2.0: extras = version byte 0x00, value = start, end, flags, max visible seqno, high
    completed seqno (36 bytes)."""

    VERSION = SnapshotMarkerVersion.V2_0
    VALUE_LAYOUT = _MARKER_V2_0
    VALUE_NAMES = _MARKER_V2_0_NAMES
    max_visible_seqno: int = 0
    high_completed_seqno: int = 0

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        cls = type(self)
        what = f"{cls.__name__} value"
        value = pack(cls.VALUE_LAYOUT, what, *[getattr(self, f) for f in cls.VALUE_NAMES])
        return _U8.pack(cls.VERSION), b"", value

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        what = cls.__name__
        (version,) = unpack_exact(_U8, frame.extras, f"{what} extras")
        if version != cls.VERSION:
            raise einval(f"{what} version", f"0x{version:02x} is not 0x{cls.VERSION:02x}")
        key_field(cls, frame.key)
        values = unpack_exact(cls.VALUE_LAYOUT, frame.value, f"{what} value")
        return dict(zip(cls.VALUE_NAMES, values, strict=True))


@dataclass(slots=True, kw_only=True)
class SnapshotMarkerV2_2(SnapshotMarkerV2_0):
    """V2.2: extras = version byte 0x02, value = V2.0 + purge seqno + high prepared seqno
    (52 bytes, PROTOCOL.md's layout)."""

    VERSION = SnapshotMarkerVersion.V2_2
    VALUE_LAYOUT = _MARKER_V2_2
    VALUE_NAMES = (*_MARKER_V2_0_NAMES, "purge_seqno", "high_prepared_seqno")
    purge_seqno: int = 0
    high_prepared_seqno: int = 0


def encode_snapshot_marker(opaque: int, vbucket: int, start: int, end: int, flags: int) -> bytes:
    """``SnapshotMarker(...).encode()`` (V1, no stream id) in one pack: a producer's path."""
    size = _MARKER_V1.size
    return _MARKER_V1_HEAD.pack(
        _REQUEST_MAGIC, _MARKER_OPCODE, 0, size, 0, vbucket, size, opaque, 0, start, end, flags
    )


def decode_snapshot_marker(frame: Frame) -> SnapshotMarker:
    """The marker of whichever version the extras announce."""
    if len(frame.extras) == 1:
        version = frame.extras[0]
        if version == SnapshotMarkerVersion.V2_0:
            return SnapshotMarkerV2_0.decode(frame)
        if version == SnapshotMarkerVersion.V2_2:
            return SnapshotMarkerV2_2.decode(frame)
        raise einval("SnapshotMarker version", f"0x{version:02x} is not 0x00 or 0x02")
    return SnapshotMarker.decode(frame)


# -- changes ---------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Mutation(Request):
    """31-byte extras, key, value. Hand-written encode/decode: the hot path of every stream."""

    OPCODE = Opcode.DcpMutation
    EXTRAS = _MUTATION_EXTRAS
    EXTRAS_FIELDS = ("by_seqno", "rev_seqno", "flags", "expiration", "lock_time", "nmeta", "nru")
    KEY = Part.REQUIRED
    VALUE = Part.OPTIONAL
    key: Bytes
    value: Bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    flags: int = 0
    expiration: int = 0
    lock_time: int = 0
    nmeta: int = 0
    nru: int = 0

    def encode(self) -> bytes:
        key, value = self.key, self.value
        if self.stream_id is not None or not key or len(key) > MAX_KEY_LEN:
            return Request.encode(self)  # the general path validates and adds framing
        try:
            head = _MUTATION_HEAD.pack(
                Magic.ClientRequest, Opcode.DcpMutation, len(key), _MUTATION_EXTRAS_LEN,
                self.datatype, self.vbucket, _MUTATION_EXTRAS_LEN + len(key) + len(value),
                self.opaque, self.cas, self.by_seqno, self.rev_seqno, self.flags,
                self.expiration, self.lock_time, self.nmeta, self.nru,
            )  # fmt: skip
        except struct.error as exc:
            raise einval(
                "Mutation", f"a field is out of range or of the wrong type ({exc})"
            ) from None
        return head + key + value

    @classmethod
    def decode(cls, frame: Frame) -> Self:
        if frame.opcode != _MUTATION_OPCODE or frame.magic not in _REQUEST_MAGICS:
            check_frame(cls, frame, request=True)
        extras = frame.extras
        if len(extras) != _MUTATION_EXTRAS_LEN:
            raise einval("Mutation extras", f"must be 31 bytes, got {len(extras)}")
        key = frame.key
        if not key:
            raise einval("Mutation key", "is required (empty key)")
        m = _new(cls)  # every field set below: the keyword __init__ costs 3x these stores
        m.by_seqno, m.rev_seqno, m.flags, m.expiration, m.lock_time, m.nmeta, m.nru = (
            _UNPACK_EXTRAS(extras)
        )
        m.opaque, m.cas, m.datatype, m.vbucket = (
            frame.opaque,
            frame.cas,
            frame.datatype,
            frame.vbucket,
        )
        m.stream_id, m.key, m.value = frame.stream_id, key, frame.value
        return m


def encode_mutation(
    opaque: int, vbucket: int, cas: int, by_seqno: int, rev_seqno: int, flags: int,
    expiration: int, datatype: int, key: bytes, value: bytes,
) -> bytes:  # fmt: skip
    """``Mutation(...).encode()`` without the object (no stream id, lock time, nmeta or nru):
    the producer's per-item path. The caller guarantees a key of 1..250 bytes."""
    head = _MUTATION_HEAD.pack(
        _REQUEST_MAGIC, _MUTATION_OPCODE, len(key), _MUTATION_EXTRAS_LEN, datatype, vbucket,
        _MUTATION_EXTRAS_LEN + len(key) + len(value), opaque, cas, by_seqno, rev_seqno, flags,
        expiration, 0, 0, 0,
    )  # fmt: skip
    return head + key + value


@dataclass(slots=True, kw_only=True)
class Deletion(Request):
    """V1 deletion: 18-byte extras (by seqno, rev seqno, nmeta), key, optional value (xattrs)."""

    OPCODE = Opcode.DcpDeletion
    EXTRAS = _DELETION_V1
    EXTRAS_FIELDS = ("by_seqno", "rev_seqno", "nmeta")
    KEY = Part.REQUIRED
    VALUE = Part.OPTIONAL
    key: Bytes
    value: Bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    nmeta: int = 0


@dataclass(slots=True, kw_only=True)
class DeletionV2(Request):
    """V2 deletion (IncludeDeleteTimes): 21-byte extras (by seqno, rev seqno, delete time,
    one unused byte sent as 0 and ignored on receipt)."""

    OPCODE = Opcode.DcpDeletion
    EXTRAS = _DELETION_V2
    EXTRAS_FIELDS = ("by_seqno", "rev_seqno", "delete_time", "_unused")
    KEY = Part.REQUIRED
    VALUE = Part.OPTIONAL
    key: Bytes
    value: Bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    delete_time: int = 0

    @property
    def _unused(self) -> int:
        return 0

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        fields = generic_fields(cls, frame)
        del fields["_unused"]
        return fields


def decode_deletion(frame: Frame) -> Deletion | DeletionV2:
    if len(frame.extras) == _DELETION_V2.size:
        return DeletionV2.decode(frame)
    return Deletion.decode(frame)


@dataclass(slots=True, kw_only=True)
class Expiration(Request):
    OPCODE = Opcode.DcpExpiration
    EXTRAS = _EXPIRATION
    EXTRAS_FIELDS = ("by_seqno", "rev_seqno", "delete_time")
    KEY = Part.REQUIRED
    VALUE = Part.OPTIONAL
    key: Bytes
    value: Bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    delete_time: int = 0


@dataclass(slots=True, kw_only=True)
class SystemEvent(Request):
    """13-byte extras (by seqno, event u32, version u8); key and value describe the event
    (collections) and are kept raw."""

    OPCODE = Opcode.DcpSystemEvent
    EXTRAS = _SYSTEM_EVENT
    EXTRAS_FIELDS = ("by_seqno", "event", "version")
    KEY = Part.OPTIONAL
    VALUE = Part.OPTIONAL
    by_seqno: int = 0
    event: int = 0
    version: int = 0
    key: Bytes = b""
    value: Bytes = b""


@dataclass(slots=True, kw_only=True)
class SeqnoAdvanced(Request):
    OPCODE = Opcode.DcpSeqnoAdvanced
    EXTRAS = _U64
    EXTRAS_FIELDS = ("by_seqno",)
    by_seqno: int = 0


@dataclass(slots=True, kw_only=True)
class OsoSnapshot(Request):
    """``flags``: 0x01 start, 0x02 end of an out-of-sequence-order backfill snapshot."""

    OPCODE = Opcode.DcpOsoSnapshot
    EXTRAS = _U32
    EXTRAS_FIELDS = ("flags",)
    flags: int = 0


# -- durable writes (synchronous replication) -------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Prepare(Request):
    """31-byte extras: by seqno, rev seqno, flags, expiration, lock time, nru, deleted,
    durability level; key, value."""

    OPCODE = Opcode.DcpPrepare
    EXTRAS = _PREPARE
    EXTRAS_FIELDS = (
        "by_seqno", "rev_seqno", "flags", "expiration", "lock_time", "nru", "deleted",
        "durability_level",
    )  # fmt: skip
    KEY = Part.REQUIRED
    VALUE = Part.OPTIONAL
    key: Bytes
    value: Bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    flags: int = 0
    expiration: int = 0
    lock_time: int = 0
    nru: int = 0
    deleted: int = 0
    durability_level: int = 0


@dataclass(slots=True, kw_only=True)
class SeqnoAcknowledged(Request):
    OPCODE = Opcode.DcpSeqnoAcknowledged
    EXTRAS = _U64
    EXTRAS_FIELDS = ("prepared_seqno",)
    prepared_seqno: int = 0


@dataclass(slots=True, kw_only=True)
class Commit(Request):
    OPCODE = Opcode.DcpCommit
    EXTRAS = _TWO_SEQNOS
    EXTRAS_FIELDS = ("prepared_seqno", "commit_seqno")
    KEY = Part.REQUIRED
    key: Bytes
    prepared_seqno: int = 0
    commit_seqno: int = 0


@dataclass(slots=True, kw_only=True)
class Abort(Request):
    OPCODE = Opcode.DcpAbort
    EXTRAS = _TWO_SEQNOS
    EXTRAS_FIELDS = ("prepared_seqno", "abort_seqno")
    KEY = Part.REQUIRED
    key: Bytes
    prepared_seqno: int = 0
    abort_seqno: int = 0


def _retired(frame: Frame) -> Message:
    raise CodecError(Status.UnknownCommand, "opcode DcpFlush (0x5a) is retired")


REQUEST_TYPES: tuple[type[Request], ...] = (
    DcpOpen, DcpControl, DcpNoop, BufferAck, DcpBarrier, AddStream, CloseStream, StreamRequest,
    GetFailoverLog, StreamEnd, SetVbucketState, SnapshotMarker, Mutation, Deletion,
    Expiration, SystemEvent, SeqnoAdvanced, OsoSnapshot, Prepare, SeqnoAcknowledged, Commit,
    Abort,
)  # fmt: skip
# opcodes with more than one layout: decoded by a function that picks the type
REQUEST_DECODERS = {
    Opcode.DcpSnapshotMarker: decode_snapshot_marker,
    Opcode.DcpDeletion: decode_deletion,
    Opcode.DcpFlush: _retired,
}
RESPONSE_TYPES: tuple[type[Response], ...] = (
    AddStreamResponse, StreamRequestOk, StreamRequestRollback, GetFailoverLogResponse,
)  # fmt: skip
# the DCP server requests (0x82) this codec knows (kv.py has the others)
SERVER_REQUEST_TYPES: tuple[type[Request], ...] = (DcpBarrier,)

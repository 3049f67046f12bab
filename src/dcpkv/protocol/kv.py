"""Typed messages of the key-value (memcached binary) protocol.

Theory of operation
-------------------
One request type per opcode listed in ``PROTOCOL.md``, and one response type per opcode whose
successful answer has a body worth typing (Get's flags, Increment's counter, Hello's features,
...). Quiet variants (GetQ, SetQ, ...) are subclasses that change only ``OPCODE``, so
``isinstance(msg, Get)`` holds for a GetQ too while equality stays exact.

Responses with an empty body (Noop, Flush, Quit, SelectBucket, SetVbucket, DelVbucket) and
every error answer are :class:`~dcpkv.protocol.base.GenericResponse`; the dispatcher in
``messages.py`` chooses. Layouts are declared with the tables described in ``base.py``; only
variable layouts (optional 16-byte MutationSeqno extras, feature lists, seqno tables) have
code of their own.

Fast paths: the server decodes a Get or a Set and encodes its answer for every request, so
those four (Get and Set families decoding, GetResponse and MutationResponse encoding) have a
``decode``/``encode`` written out for their one layout instead of walking the tables: the same
checks, the same messages, the same bytes (a test holds each to the table-driven path), at a
fraction of the cost. ``GET_RESPONSES`` and ``MUTATION_RESPONSES`` give the answer type of each
request opcode (a GetK is answered by a GetKResponse).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntFlag
from typing import Any

from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol.base import (
    REQUEST_MAGICS,
    Part,
    Request,
    Response,
    ValueCodec,
    check_frame,
    einval,
    generic_fields,
    generic_parts,
    key_field,
    no_extras,
    pack,
    unpack_exact,
    value_field,
)
from dcpkv.protocol.constants import MAX_KEY_LEN, HelloFeature, Magic, Opcode, ServerOpcode
from dcpkv.protocol.frame import HEADER, Bytes, Frame

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
FLAGS_EXPIRY = struct.Struct(">II")  # a Set's (Add's, Replace's) extras
_ARITH = struct.Struct(">QQI")
_SEQNO_EXTRAS = struct.Struct(">QQ")  # MutationSeqno: vbucket uuid, seqno
_VB_SEQNO = struct.Struct(">HQ")
_OBSERVE_0 = struct.Struct(">BHQQQ")
_OBSERVE_1 = struct.Struct(">BHQQQQQ")
_META = struct.Struct(">IIIQ")  # GetMeta answer: deleted, flags, expiry, rev seqno
_FEATURE_BY_VALUE = {f.value: f for f in HelloFeature}
# Fast paths (these encoders, and the server's request fast path, which packs its answers with
# the same layouts): the response header fused with the fixed extras that follow it.
GET_HIT = struct.Struct(">BBHBBHIIQI")  # + flags
MUTATED = struct.Struct(">BBHBBHIIQQQ")  # + vbucket uuid, seqno (MutationSeqno)
# A Set's success without MutationSeqno: the 12 bytes of its header that never change (magic,
# opcode, no key, no extras, no datatype, Success, no body), then opaque and CAS.
SET_OK = struct.Struct(">12sIQ")
SET_OK_HEAD = HEADER.pack(Magic.ClientResponse, Opcode.Set, 0, 0, 0, 0, 0, 0, 0)[:12]


def _vbucket_state(value: int, what: str) -> VBucketState:
    try:
        return VBucketState(value)
    except ValueError:
        raise einval(what, f"{value} is not a vbucket state (1-4)") from None


def _optional_u32_extras(value: int | None, what: str) -> Bytes:
    return b"" if value is None else pack(_U32, what, value)


def _optional_u32_field(cls: type[Request], frame: Frame) -> int | None:
    """The optional 4-byte extras of a request that has no key and no value."""
    key_field(cls, frame.key)
    value_field(cls, frame.value)
    if not frame.extras:
        return None
    (value,) = unpack_exact(_U32, frame.extras, f"{cls.__name__} extras")
    return int(value)


# -- Get family ------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Get(Request):
    OPCODE = Opcode.Get
    KEY = Part.REQUIRED
    key: Bytes

    @classmethod
    def decode(cls, frame: Frame) -> Get:
        if frame.opcode != cls.OPCODE or frame.magic not in REQUEST_MAGICS:
            check_frame(cls, frame, request=True)  # raises, naming what is wrong
        what = cls.__name__
        if frame.extras:
            raise einval(f"{what} extras", f"must be empty, got {len(frame.extras)} bytes")
        key = frame.key
        if not key:
            raise einval(f"{what} key", "is required (empty key)")
        if frame.value:
            raise einval(f"{what} value", f"must be empty, got {len(frame.value)} bytes")
        # Every field set here, without __init__: its keyword parsing costs more than the
        # decoding itself (the table-equality test catches a field left out).
        msg = object.__new__(cls)
        msg.opaque, msg.cas, msg.datatype = frame.opaque, frame.cas, frame.datatype
        msg.vbucket, msg.stream_id, msg.key = frame.vbucket, frame.stream_id, key
        return msg


class GetQ(Get):
    __slots__ = ()
    OPCODE = Opcode.GetQ


class GetK(Get):
    __slots__ = ()
    OPCODE = Opcode.GetK


class GetKQ(Get):
    __slots__ = ()
    OPCODE = Opcode.GetKQ


@dataclass(slots=True, kw_only=True)
class GetResponse(Response):
    """A hit: 4-byte flags extras, the value, and the key for GetK/GetKQ."""

    OPCODE = Opcode.Get
    EXTRAS = _U32
    EXTRAS_FIELDS = ("flags",)
    KEY = Part.OPTIONAL
    VALUE = Part.OPTIONAL
    flags: int = 0
    key: Bytes = b""
    value: Bytes = b""

    def encode(self) -> bytes:
        key, value = self.key, self.value
        if len(key) > MAX_KEY_LEN:
            raise einval(f"{type(self).__name__} key", f"{len(key)} bytes exceed {MAX_KEY_LEN}")
        try:
            head = GET_HIT.pack(
                Magic.ClientResponse, self.OPCODE, len(key), 4, self.datatype, self.status,
                4 + len(key) + len(value), self.opaque, self.cas, self.flags,
            )  # fmt: skip
        except struct.error as exc:
            raise einval(type(self).__name__, f"a field is out of range ({exc})") from None
        return b"".join((head, key, value)) if key else head + value


class GetQResponse(GetResponse):
    __slots__ = ()
    OPCODE = Opcode.GetQ


class GetKResponse(GetResponse):
    __slots__ = ()
    OPCODE = Opcode.GetK


class GetKQResponse(GetResponse):
    __slots__ = ()
    OPCODE = Opcode.GetKQ


class GATResponse(GetResponse):
    __slots__ = ()
    OPCODE = Opcode.GAT


# -- storage ---------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Set(Request):
    OPCODE = Opcode.Set
    EXTRAS = FLAGS_EXPIRY
    EXTRAS_FIELDS = ("flags", "expiration")
    KEY = Part.REQUIRED
    VALUE = Part.OPTIONAL
    key: Bytes
    value: Bytes = b""
    flags: int = 0
    expiration: int = 0

    @classmethod
    def decode(cls, frame: Frame) -> Set:
        if frame.opcode != cls.OPCODE or frame.magic not in REQUEST_MAGICS:
            check_frame(cls, frame, request=True)  # raises, naming what is wrong
        what = cls.__name__
        flags, expiration = unpack_exact(FLAGS_EXPIRY, frame.extras, f"{what} extras")
        key = frame.key
        if not key:
            raise einval(f"{what} key", "is required (empty key)")
        msg = object.__new__(cls)  # as in Get.decode: every field, without __init__
        msg.opaque, msg.cas, msg.datatype = frame.opaque, frame.cas, frame.datatype
        msg.vbucket, msg.stream_id, msg.key, msg.value = (
            frame.vbucket,
            frame.stream_id,
            key,
            frame.value,
        )
        msg.flags, msg.expiration = flags, expiration
        return msg


class SetQ(Set):
    __slots__ = ()
    OPCODE = Opcode.SetQ


class Add(Set):
    __slots__ = ()
    OPCODE = Opcode.Add


class AddQ(Set):
    __slots__ = ()
    OPCODE = Opcode.AddQ


class Replace(Set):
    __slots__ = ()
    OPCODE = Opcode.Replace


class ReplaceQ(Set):
    __slots__ = ()
    OPCODE = Opcode.ReplaceQ


@dataclass(slots=True, kw_only=True)
class Delete(Request):
    OPCODE = Opcode.Delete
    KEY = Part.REQUIRED
    key: Bytes


class DeleteQ(Delete):
    __slots__ = ()
    OPCODE = Opcode.DeleteQ


@dataclass(slots=True, kw_only=True)
class Append(Request):
    OPCODE = Opcode.Append
    KEY = Part.REQUIRED
    VALUE = Part.OPTIONAL
    key: Bytes
    value: Bytes = b""


class Prepend(Append):
    __slots__ = ()
    OPCODE = Opcode.Prepend


@dataclass(slots=True, kw_only=True)
class Touch(Request):
    OPCODE = Opcode.Touch
    EXTRAS = _U32
    EXTRAS_FIELDS = ("expiration",)
    KEY = Part.REQUIRED
    key: Bytes
    expiration: int = 0


class GAT(Touch):
    """Get-and-touch: answered by a :class:`GATResponse`."""

    __slots__ = ()
    OPCODE = Opcode.GAT


def _seqno_parts(msg: Any, value: Bytes) -> tuple[Bytes, Bytes, Bytes]:
    if (msg.vbucket_uuid is None) != (msg.seqno is None):
        raise einval(f"{type(msg).__name__} vbucket_uuid/seqno", "set both or neither")
    extras: Bytes = b""
    if msg.seqno is not None:
        extras = pack(_SEQNO_EXTRAS, f"{type(msg).__name__} extras", msg.vbucket_uuid, msg.seqno)
    return extras, b"", value


def _seqno_fields(cls: type, frame: Frame) -> dict[str, Any]:
    if not frame.extras:
        return {"vbucket_uuid": None, "seqno": None}
    uuid, seqno = unpack_exact(_SEQNO_EXTRAS, frame.extras, f"{cls.__name__} extras")
    return {"vbucket_uuid": uuid, "seqno": seqno}


@dataclass(slots=True, kw_only=True)
class MutationResponse(Response):
    """Success of Set/Add/Replace/Delete/Append/Prepend/Touch (and quiet forms). With the
    MutationSeqno feature the extras carry (vbucket uuid, seqno); otherwise none."""

    OPCODE = Opcode.Set
    vbucket_uuid: int | None = None
    seqno: int | None = None

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        return _seqno_parts(self, b"")

    def encode(self) -> bytes:
        uuid, seqno = self.vbucket_uuid, self.seqno
        try:
            if uuid is None and seqno is None:
                return HEADER.pack(
                    Magic.ClientResponse, self.OPCODE, 0, 0, self.datatype, self.status, 0,
                    self.opaque, self.cas,
                )  # fmt: skip
            if uuid is None or seqno is None:
                raise einval(f"{type(self).__name__} vbucket_uuid/seqno", "set both or neither")
            return MUTATED.pack(
                Magic.ClientResponse, self.OPCODE, 0, 16, self.datatype, self.status, 16,
                self.opaque, self.cas, uuid, seqno,
            )  # fmt: skip
        except struct.error as exc:
            raise einval(type(self).__name__, f"a field is out of range ({exc})") from None

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        key_field(cls, frame.key)
        value_field(cls, frame.value)
        return _seqno_fields(cls, frame)


def _mutation_response(name: str, opcode: Opcode) -> type[MutationResponse]:
    return type(name, (MutationResponse,), {"__slots__": (), "OPCODE": opcode})


SetQResponse = _mutation_response("SetQResponse", Opcode.SetQ)
AddResponse = _mutation_response("AddResponse", Opcode.Add)
AddQResponse = _mutation_response("AddQResponse", Opcode.AddQ)
ReplaceResponse = _mutation_response("ReplaceResponse", Opcode.Replace)
ReplaceQResponse = _mutation_response("ReplaceQResponse", Opcode.ReplaceQ)
DeleteResponse = _mutation_response("DeleteResponse", Opcode.Delete)
DeleteQResponse = _mutation_response("DeleteQResponse", Opcode.DeleteQ)
AppendResponse = _mutation_response("AppendResponse", Opcode.Append)
PrependResponse = _mutation_response("PrependResponse", Opcode.Prepend)
TouchResponse = _mutation_response("TouchResponse", Opcode.Touch)


# -- arithmetic ------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Increment(Request):
    OPCODE = Opcode.Increment
    EXTRAS = _ARITH
    EXTRAS_FIELDS = ("delta", "initial", "expiration")
    KEY = Part.REQUIRED
    key: Bytes
    delta: int = 1
    initial: int = 0
    expiration: int = 0


class Decrement(Increment):
    __slots__ = ()
    OPCODE = Opcode.Decrement


@dataclass(slots=True, kw_only=True)
class IncrementResponse(Response):
    """The new counter (value u64), plus MutationSeqno extras when negotiated."""

    OPCODE = Opcode.Increment
    counter: int = 0
    vbucket_uuid: int | None = None
    seqno: int | None = None

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        value = pack(_U64, f"{type(self).__name__} counter", self.counter)
        return _seqno_parts(self, value)

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        key_field(cls, frame.key)
        (counter,) = unpack_exact(_U64, frame.value, f"{cls.__name__} value")
        return {"counter": counter, **_seqno_fields(cls, frame)}


class DecrementResponse(IncrementResponse):
    __slots__ = ()
    OPCODE = Opcode.Decrement


# -- connection and administration -----------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Quit(Request):
    OPCODE = Opcode.Quit


@dataclass(slots=True, kw_only=True)
class Flush(Request):
    """Optional 4-byte extras: a delay in seconds (memcached's delayed flush)."""

    OPCODE = Opcode.Flush
    delay: int | None = None

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        return _optional_u32_extras(self.delay, "Flush delay"), b"", b""

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        return {"delay": _optional_u32_field(cls, frame)}


@dataclass(slots=True, kw_only=True)
class Noop(Request):
    OPCODE = Opcode.Noop


@dataclass(slots=True, kw_only=True)
class Version(Request):
    OPCODE = Opcode.Version


@dataclass(slots=True, kw_only=True)
class VersionResponse(Response):
    OPCODE = Opcode.Version
    VALUE = Part.OPTIONAL
    VALUE_FIELD = "version"
    VALUE_TEXT = True
    version: str = ""


@dataclass(slots=True, kw_only=True)
class Stat(Request):
    """Key = stat group (empty for the default group), e.g. ``vbucket-seqno``."""

    OPCODE = Opcode.Stat
    KEY = Part.OPTIONAL
    KEY_FIELD = "group"
    KEY_TEXT = True
    group: str = ""


@dataclass(slots=True, kw_only=True)
class StatResponse(Response):
    """One stat; the answer ends with one whose name is empty."""

    OPCODE = Opcode.Stat
    KEY = Part.OPTIONAL
    KEY_FIELD = "name"
    KEY_TEXT = True
    VALUE = Part.OPTIONAL
    VALUE_TEXT = True
    name: str = ""
    value: str = ""


def encode_stats(opaque: int, stats: Iterable[tuple[str, object]]) -> bytes:
    """A whole Stat answer: a :class:`StatResponse` per ``(name, str(value))``, then the empty
    one that ends it, byte for byte as their ``encode()`` would make them, without a message
    object per stat. A group over every vbucket is thousands of frames (``vbucket-seqno`` at
    1,024 vbuckets: 4,097), asked by every Spark batch's planning, and the event loop makes them
    with nothing else served meanwhile: 9.8 ms of server CPU a call through the messages."""
    pack = HEADER.pack
    magic, opcode = int(Magic.ClientResponse), int(Opcode.Stat)
    out: list[bytes] = []
    append = out.append
    for name, value in stats:
        key = name.encode()
        body = str(value).encode()
        append(pack(magic, opcode, len(key), 0, 0, 0, len(key) + len(body), opaque, 0))
        append(key)
        append(body)
    append(pack(magic, opcode, 0, 0, 0, 0, 0, opaque, 0))
    return b"".join(out)


def _features_value(features: tuple[int, ...], what: str) -> bytes:
    return b"".join(pack(_U16, what, f) for f in features)


def _features(value: Bytes, what: str) -> tuple[int, ...]:
    if len(value) % 2:
        raise einval(what, f"feature list of {len(value)} bytes is not a list of u16")
    return tuple(_FEATURE_BY_VALUE.get(f, f) for (f,) in _U16.iter_unpack(value))


FEATURES = ValueCodec(_features_value, _features)


@dataclass(slots=True, kw_only=True)
class Hello(Request):
    """Key = user agent (often JSON), value = the features asked for (u16 each)."""

    OPCODE = Opcode.Hello
    KEY = Part.OPTIONAL
    KEY_FIELD = "agent"
    KEY_TEXT = True
    VALUE_FIELD = "features"
    VALUE_CODEC = FEATURES
    agent: str = ""
    features: tuple[int, ...] = ()


@dataclass(slots=True, kw_only=True)
class HelloResponse(Response):
    OPCODE = Opcode.Hello
    VALUE_FIELD = "features"
    VALUE_CODEC = FEATURES
    features: tuple[int, ...] = ()


@dataclass(slots=True, kw_only=True)
class SaslListMechs(Request):
    OPCODE = Opcode.SaslListMechs


@dataclass(slots=True, kw_only=True)
class SaslListMechsResponse(Response):
    """Value = mechanism names separated by spaces."""

    OPCODE = Opcode.SaslListMechs
    VALUE = Part.OPTIONAL
    VALUE_FIELD = "mechanisms"
    VALUE_TEXT = True
    mechanisms: str = ""


@dataclass(slots=True, kw_only=True)
class SaslAuth(Request):
    """Key = mechanism (e.g. PLAIN), value = its data (``\\0user\\0password`` for PLAIN)."""

    OPCODE = Opcode.SaslAuth
    KEY = Part.REQUIRED
    KEY_FIELD = "mechanism"
    KEY_TEXT = True
    VALUE = Part.OPTIONAL
    VALUE_FIELD = "data"
    mechanism: str
    data: Bytes = b""


class SaslStep(SaslAuth):
    __slots__ = ()
    OPCODE = Opcode.SaslStep


@dataclass(slots=True, kw_only=True)
class SaslAuthResponse(Response):
    """Success, or AuthContinue with the server's challenge in ``data``."""

    OPCODE = Opcode.SaslAuth
    STATUSES = frozenset({Status.Success, Status.AuthContinue})
    VALUE = Part.OPTIONAL
    VALUE_FIELD = "data"
    data: Bytes = b""


class SaslStepResponse(SaslAuthResponse):
    __slots__ = ()
    OPCODE = Opcode.SaslStep


@dataclass(slots=True, kw_only=True)
class SelectBucket(Request):
    OPCODE = Opcode.SelectBucket
    KEY = Part.REQUIRED
    KEY_FIELD = "bucket"
    KEY_TEXT = True
    bucket: str


# -- vbuckets --------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class SetVbucket(Request):
    """The new state in the extras: 1 byte in current servers, 4 in older ones (both are
    read; 4 are written, which both kinds of server read). An optional value (datatype JSON)
    carries extra vbucket information, kept raw. The header's CAS carries the bucket's state
    CAS when the sender orders its state changes (spec 002; 0: unconditional)."""

    OPCODE = Opcode.SetVbucket
    VALUE = Part.OPTIONAL
    VALUE_FIELD = "meta"
    state: int = VBucketState.ACTIVE
    meta: Bytes = b""

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        return pack(_U32, "SetVbucket extras", self.state), b"", self.meta

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        key_field(cls, frame.key)
        extras = frame.extras
        if len(extras) == 1:
            state = extras[0]
        else:
            (state,) = unpack_exact(_U32, extras, "SetVbucket extras (1 or 4 bytes)")
        return {"state": _vbucket_state(state, "SetVbucket state"), "meta": frame.value}


@dataclass(slots=True, kw_only=True)
class GetVbucket(Request):
    OPCODE = Opcode.GetVbucket


@dataclass(slots=True, kw_only=True)
class GetVbucketResponse(Response):
    OPCODE = Opcode.GetVbucket
    VALUE_STRUCT = _U32
    VALUE_FIELDS = ("state",)
    state: int = VBucketState.ACTIVE

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        fields = generic_fields(cls, frame)
        fields["state"] = _vbucket_state(fields["state"], "GetVbucketResponse state")
        return fields


@dataclass(slots=True, kw_only=True)
class DelVbucket(Request):
    OPCODE = Opcode.DelVbucket


@dataclass(slots=True, kw_only=True)
class GetAllVbSeqnos(Request):
    """Optional 4-byte extras: only vbuckets in this state (absent or 0 = every state but
    dead)."""

    OPCODE = Opcode.GetAllVbSeqnos
    state: int | None = None

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        return _optional_u32_extras(self.state, "GetAllVbSeqnos state"), b"", b""

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        state = _optional_u32_field(cls, frame)
        if not state:
            return {"state": None}  # 0 filters nothing, as no extras
        return {"state": _vbucket_state(state, "GetAllVbSeqnos state")}


@dataclass(slots=True, kw_only=True)
class GetAllVbSeqnosResponse(Response):
    """Value = (vbucket u16, high seqno u64) pairs."""

    OPCODE = Opcode.GetAllVbSeqnos
    seqnos: tuple[tuple[int, int], ...] = ()

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        what = "GetAllVbSeqnosResponse seqnos"
        return b"", b"", b"".join(pack(_VB_SEQNO, what, vb, s) for vb, s in self.seqnos)

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        no_extras(cls, frame)
        key_field(cls, frame.key)
        if len(frame.value) % _VB_SEQNO.size:
            raise einval("GetAllVbSeqnosResponse value", f"{len(frame.value)} bytes is not n*10")
        return {"seqnos": tuple(_VB_SEQNO.iter_unpack(frame.value))}


@dataclass(slots=True, kw_only=True)
class ObserveSeqno(Request):
    """Vbucket in the header, value = the vbucket uuid the client knows."""

    OPCODE = Opcode.ObserveSeqno
    VALUE_STRUCT = _U64
    VALUE_FIELDS = ("vbucket_uuid",)
    vbucket_uuid: int = 0


@dataclass(slots=True, kw_only=True)
class ObserveSeqnoResponse(Response):
    """Format 0: no failover since that uuid; format 1 (hard failover) adds the old uuid and
    the last seqno received on it, present exactly when ``old_vbucket_uuid`` is set."""

    OPCODE = Opcode.ObserveSeqno
    vbucket: int = 0
    vbucket_uuid: int = 0
    last_persisted_seqno: int = 0
    current_seqno: int = 0
    old_vbucket_uuid: int | None = None
    last_received_seqno: int | None = None

    @property
    def failed_over(self) -> bool:
        return self.old_vbucket_uuid is not None

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        what = "ObserveSeqnoResponse"
        base = (self.vbucket, self.vbucket_uuid, self.last_persisted_seqno, self.current_seqno)
        if (self.old_vbucket_uuid is None) != (self.last_received_seqno is None):
            raise einval(f"{what} old_vbucket_uuid/last_received_seqno", "set both or neither")
        if self.old_vbucket_uuid is None:
            return b"", b"", pack(_OBSERVE_0, what, 0, *base)
        extra = (self.old_vbucket_uuid, self.last_received_seqno)
        return b"", b"", pack(_OBSERVE_1, what, 1, *base, *extra)

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        key_field(cls, frame.key)
        no_extras(cls, frame)
        value = frame.value
        fmt = value[0] if value else None
        if fmt == 0:
            _, vb, uuid, persisted, current = unpack_exact(_OBSERVE_0, value, "ObserveSeqno value")
            old = received = None
        elif fmt == 1:
            _, vb, uuid, persisted, current, old, received = unpack_exact(
                _OBSERVE_1, value, "ObserveSeqnoResponse value"
            )
        else:
            raise einval("ObserveSeqnoResponse format", f"{fmt} is not 0 or 1")
        return {
            "vbucket": vb,
            "vbucket_uuid": uuid,
            "last_persisted_seqno": persisted,
            "current_seqno": current,
            "old_vbucket_uuid": old,
            "last_received_seqno": received,
        }


@dataclass(slots=True, kw_only=True)
class GetMeta(Request):
    """A key's metadata, tombstones included (XDCR's conflict check, a replica's repair).
    Optional 1-byte extras: the answer's version (2 adds the datatype byte)."""

    OPCODE = Opcode.GetMeta
    KEY = Part.REQUIRED
    key: Bytes
    version: int = 1

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        extras = bytes([self.version]) if self.version == 2 else b""
        return extras, self.key, b""

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        if len(frame.extras) > 1:
            raise einval("GetMeta extras", f"must be 0 or 1 bytes, got {len(frame.extras)}")
        version = frame.extras[0] if frame.extras else 1
        if version not in (1, 2):
            raise einval("GetMeta version", f"{version} is not 1 or 2")
        return {**key_field(cls, frame.key), "version": version}


@dataclass(slots=True, kw_only=True)
class GetMetaResponse(Response):
    """Extras: deleted (u32), flags, expiry, rev seqno (u64), and for version 2 the
    datatype (u8); the CAS in the header."""

    OPCODE = Opcode.GetMeta
    deleted: bool = False
    flags: int = 0
    expiry: int = 0
    rev_seqno: int = 0
    item_datatype: int | None = None  # version 2 only

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        what = "GetMetaResponse extras"
        extras = pack(_META, what, int(self.deleted), self.flags, self.expiry, self.rev_seqno)
        if self.item_datatype is not None:
            extras += pack(_U8, what, self.item_datatype)
        return extras, b"", b""

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        extras, datatype = frame.extras, None
        if len(extras) == _META.size + 1:
            extras, datatype = extras[:-1], extras[-1]
        deleted, flags, expiry, rev = unpack_exact(_META, extras, "GetMetaResponse extras")
        return {
            "deleted": bool(deleted), "flags": flags, "expiry": expiry, "rev_seqno": rev,
            "item_datatype": datatype,
        }  # fmt: skip


class GetqMeta(GetMeta):
    """GetMeta's quiet form: a miss (KeyEnoent) is not answered."""

    __slots__ = ()
    OPCODE = Opcode.GetqMeta


class GetqMetaResponse(GetMetaResponse):
    __slots__ = ()
    OPCODE = Opcode.GetqMeta


# -- with-meta writes (XDCR) -----------------------------------------------------------------

WITH_META = struct.Struct(">IIQQ")  # flags, expiration, rev seqno, cas
WITH_META_OPTIONS = struct.Struct(WITH_META.format + "I")  # ... and the options word
WITH_META_EXTRAS_LENGTHS = (24, 26, 28, 30)


class WithMetaOption(IntFlag):
    """The options word of a with-meta write (its extras' optional u32)."""

    FORCE = 0x01  # skip conflict resolution
    FORCE_ACCEPT = 0x02  # timestamp (lww) buckets only
    REGENERATE_CAS = 0x04  # store a new local CAS (needs SKIP_CONFLICT_RESOLUTION)
    SKIP_CONFLICT_RESOLUTION = 0x08
    IS_EXPIRATION = 0x10  # a DelWithMeta that is an expiration


@dataclass(slots=True, kw_only=True)
class SetWithMeta(Request):
    """Store a document with the metadata it had elsewhere (a replicator's write). Extras:
    flags u32, expiration u32 (absolute unix seconds; a delete's time for DelWithMeta), rev
    seqno u64, cas u64, then optionally options u32 (lengths 28, 30) and nmeta u16 (26, 30:
    the count of extended-meta bytes ending the value, which are dropped). The header's CAS
    is an ordinary compare-and-swap."""

    OPCODE = Opcode.SetWithMeta
    KEY = Part.REQUIRED
    VALUE = Part.OPTIONAL
    key: Bytes
    value: Bytes = b""
    flags: int = 0
    expiration: int = 0
    rev_seqno: int = 0
    meta_cas: int = 0
    options: int | None = None
    nmeta: int | None = None

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        what = f"{type(self).__name__} extras"
        extras = pack(WITH_META, what, self.flags, self.expiration, self.rev_seqno, self.meta_cas)
        if self.options is not None:
            extras += pack(_U32, what, self.options)
        if self.nmeta is not None:
            extras += pack(_U16, what, self.nmeta)
        return extras, self.key, self.value

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        extras, what = frame.extras, f"{cls.__name__} extras"
        if len(extras) not in WITH_META_EXTRAS_LENGTHS:
            raise einval(what, f"must be 24, 26, 28 or 30 bytes, got {len(extras)}")
        flags, expiration, rev, cas = WITH_META.unpack_from(extras)
        options = _U32.unpack_from(extras, 24)[0] if len(extras) in (28, 30) else None
        nmeta = _U16.unpack_from(extras, len(extras) - 2)[0] if len(extras) in (26, 30) else None
        return {
            **key_field(cls, frame.key), **value_field(cls, frame.value), "flags": flags,
            "expiration": expiration, "rev_seqno": rev, "meta_cas": cas, "options": options,
            "nmeta": nmeta,
        }  # fmt: skip


class SetqWithMeta(SetWithMeta):
    __slots__ = ()
    OPCODE = Opcode.SetqWithMeta


class AddWithMeta(SetWithMeta):
    __slots__ = ()
    OPCODE = Opcode.AddWithMeta


class AddqWithMeta(SetWithMeta):
    __slots__ = ()
    OPCODE = Opcode.AddqWithMeta


class DelWithMeta(SetWithMeta):
    """A deletion with its source's metadata; the value is empty or the tombstone's xattrs."""

    __slots__ = ()
    OPCODE = Opcode.DelWithMeta


class DelqWithMeta(SetWithMeta):
    __slots__ = ()
    OPCODE = Opcode.DelqWithMeta


WITH_META_TYPES: tuple[type[SetWithMeta], ...] = (
    SetWithMeta, SetqWithMeta, AddWithMeta, AddqWithMeta, DelWithMeta, DelqWithMeta,
)  # fmt: skip


class SetWithMetaResponse(MutationResponse):
    __slots__ = ()
    OPCODE = Opcode.SetWithMeta


class SetqWithMetaResponse(MutationResponse):
    __slots__ = ()
    OPCODE = Opcode.SetqWithMeta


class AddWithMetaResponse(MutationResponse):
    __slots__ = ()
    OPCODE = Opcode.AddWithMeta


class AddqWithMetaResponse(MutationResponse):
    __slots__ = ()
    OPCODE = Opcode.AddqWithMeta


class DelWithMetaResponse(MutationResponse):
    __slots__ = ()
    OPCODE = Opcode.DelWithMeta


class DelqWithMetaResponse(MutationResponse):
    __slots__ = ()
    OPCODE = Opcode.DelqWithMeta


@dataclass(slots=True, kw_only=True)
class SeqnoPersistence(Request):
    """Answered (empty success) once the vbucket in the header has persisted through
    ``seqno`` (extras, u64), or with an error. The spec's failover-id check, this project's
    extension: a second u64 of extras names the vbucket uuid the seqno belongs to, refused
    when the vbucket's history no longer holds it (0 or absent: unchecked)."""

    OPCODE = Opcode.SeqnoPersistence
    seqno: int = 0
    vbucket_uuid: int = 0

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        what = "SeqnoPersistence extras"
        if not self.vbucket_uuid:
            return pack(_U64, what, self.seqno), b"", b""
        return pack(_SEQNO_EXTRAS, what, self.seqno, self.vbucket_uuid), b"", b""

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        key_field(cls, frame.key)
        value_field(cls, frame.value)
        extras = frame.extras
        if len(extras) == _U64.size:
            (seqno,), uuid = unpack_exact(_U64, extras, "SeqnoPersistence extras"), 0
        elif len(extras) == _SEQNO_EXTRAS.size:
            seqno, uuid = unpack_exact(_SEQNO_EXTRAS, extras, "SeqnoPersistence extras")
        else:
            raise einval("SeqnoPersistence extras", f"{len(extras)} bytes is not 8 or 16")
        return {"seqno": seqno, "vbucket_uuid": uuid}


# -- cluster ---------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class SetClusterConfig(Request):
    """How a cluster manager hands a node the map: key = bucket name, value = the config
    JSON (raw; the node reads its ``rev``)."""

    OPCODE = Opcode.SetClusterConfig
    KEY = Part.OPTIONAL
    KEY_FIELD = "bucket"
    KEY_TEXT = True
    VALUE = Part.REQUIRED
    VALUE_FIELD = "config"
    bucket: str = ""
    config: Bytes = b""


@dataclass(slots=True, kw_only=True)
class RbacRefresh(Request):
    """How a cluster manager hands a node the users document (value: its JSON, with SCRAM
    verifiers, never passwords; the node keeps it when its ``rev`` is newer)."""

    OPCODE = Opcode.RbacRefresh
    VALUE = Part.REQUIRED
    VALUE_FIELD = "users"
    users: Bytes = b""


@dataclass(slots=True, kw_only=True)
class GetClusterConfig(Request):
    OPCODE = Opcode.GetClusterConfig


@dataclass(slots=True, kw_only=True)
class GetClusterConfigResponse(Response):
    """Value = the cluster map JSON, raw."""

    OPCODE = Opcode.GetClusterConfig
    VALUE = Part.OPTIONAL
    VALUE_FIELD = "config"
    config: Bytes = b""


@dataclass(slots=True, kw_only=True)
class ClustermapChangeNotification(Request):
    """A server request (magic 0x82) to a client that asked Hello for Duplex and
    ClustermapChangeNotification: the node serves a new map. Key = bucket name, extras =
    (revEpoch, rev) (4 bytes, the rev alone, from older servers), value = the config JSON.
    No answer is expected."""

    OPCODE = ServerOpcode.ClustermapChangeNotification
    KEY = Part.OPTIONAL
    KEY_FIELD = "bucket"
    KEY_TEXT = True
    VALUE = Part.OPTIONAL
    VALUE_FIELD = "config"
    bucket: str = ""
    epoch: int = 0
    rev: int = 0
    config: Bytes = b""

    def _magic(self) -> int:
        return Magic.ServerRequest

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        _, key, value = generic_parts(self)
        return (
            pack(_SEQNO_EXTRAS, "ClustermapChangeNotification extras", self.epoch, self.rev),
            key,
            value,
        )

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        extras = frame.extras
        if len(extras) == _U32.size:
            epoch, (rev,) = 0, _U32.unpack(extras)
        else:
            epoch, rev = unpack_exact(_SEQNO_EXTRAS, extras, "ClustermapChangeNotification extras")
        return {
            "epoch": epoch,
            "rev": rev,
            **key_field(cls, frame.key),
            **value_field(cls, frame.value),
        }


@dataclass(slots=True, kw_only=True)
class GetErrorMap(Request):
    OPCODE = Opcode.GetErrorMap
    VALUE_STRUCT = _U16
    VALUE_FIELDS = ("version",)
    version: int = 1


@dataclass(slots=True, kw_only=True)
class GetErrorMapResponse(Response):
    """Value = the error map JSON, raw."""

    OPCODE = Opcode.GetErrorMap
    VALUE = Part.OPTIONAL
    VALUE_FIELD = "error_map"
    error_map: Bytes = b""


REQUEST_TYPES: tuple[type[Request], ...] = (
    Get, GetQ, GetK, GetKQ, Set, SetQ, Add, AddQ, Replace, ReplaceQ, Delete, DeleteQ,
    Append, Prepend, Touch, GAT, Increment, Decrement, Quit, Flush, Noop, Version, Stat,
    Hello, SaslListMechs, SaslAuth, SaslStep, SelectBucket, SetVbucket, GetVbucket, DelVbucket,
    GetAllVbSeqnos, ObserveSeqno, GetMeta, SeqnoPersistence, SetClusterConfig,
    GetClusterConfig, GetErrorMap, RbacRefresh, GetqMeta, *WITH_META_TYPES,
)  # fmt: skip

# server requests (magic 0x82)
SERVER_REQUEST_TYPES: tuple[type[Request], ...] = (ClustermapChangeNotification,)

RESPONSE_TYPES: tuple[type[Response], ...] = (
    GetResponse, GetQResponse, GetKResponse, GetKQResponse, GATResponse,
    MutationResponse, SetQResponse, AddResponse, AddQResponse, ReplaceResponse,
    ReplaceQResponse, DeleteResponse, DeleteQResponse, AppendResponse, PrependResponse,
    TouchResponse, IncrementResponse, DecrementResponse, VersionResponse, StatResponse,
    HelloResponse, SaslListMechsResponse, SaslAuthResponse, SaslStepResponse,
    GetVbucketResponse, GetAllVbSeqnosResponse, ObserveSeqnoResponse, GetMetaResponse,
    GetClusterConfigResponse, GetErrorMapResponse, GetqMetaResponse, SetWithMetaResponse,
    SetqWithMetaResponse, AddWithMetaResponse, AddqWithMetaResponse, DelWithMetaResponse,
    DelqWithMetaResponse,
)  # fmt: skip


# The answer type of each request opcode, for the families whose answers have a body.
GET_RESPONSES: dict[int, type[GetResponse]] = {
    Opcode.Get: GetResponse, Opcode.GetQ: GetQResponse, Opcode.GetK: GetKResponse,
    Opcode.GetKQ: GetKQResponse, Opcode.GAT: GATResponse,
}  # fmt: skip
MUTATION_RESPONSES: dict[int, type[MutationResponse]] = {
    t.OPCODE: t for t in (
        MutationResponse, SetQResponse, AddResponse, AddQResponse, ReplaceResponse,
        ReplaceQResponse, DeleteResponse, DeleteQResponse, AppendResponse, PrependResponse,
        TouchResponse,
    )
}  # fmt: skip
WITH_META_RESPONSES: dict[int, type[MutationResponse]] = {
    t.OPCODE: t for t in (
        SetWithMetaResponse, SetqWithMetaResponse, AddWithMetaResponse, AddqWithMetaResponse,
        DelWithMetaResponse, DelqWithMetaResponse,
    )
}  # fmt: skip

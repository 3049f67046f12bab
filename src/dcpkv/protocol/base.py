"""The shared machinery of typed messages: header fields, layout tables, strict checks.

Theory of operation
-------------------
A typed message is a slotted, keyword-only dataclass. :class:`Request` carries the request
header fields (opaque, vbucket, cas, datatype, DCP stream id), :class:`Response` the response
ones (opaque, status, cas, datatype). Most message types are described by class variables
instead of code:

``EXTRAS`` / ``EXTRAS_FIELDS``
    a precompiled ``struct.Struct`` and the attribute names it packs, in order. The extras
    length on the wire must equal ``EXTRAS.size`` exactly (no extras when ``EXTRAS`` is None).
``KEY`` / ``KEY_FIELD`` / ``KEY_TEXT``
    whether a key is forbidden, optional or required, which attribute holds it, and whether
    it is UTF-8 text (``str``) rather than bytes.
``VALUE`` / ``VALUE_FIELD`` / ``VALUE_TEXT`` / ``VALUE_STRUCT`` / ``VALUE_FIELDS``
    the same for the value; ``VALUE_STRUCT`` makes a fixed-size binary value (e.g. the u64 of
    an Increment response) unpacked into ``VALUE_FIELDS``.
``VALUE_CODEC``
    a :class:`ValueCodec` for a value of a variable layout (a list: a failover log, HELLO's
    features), held decoded in ``VALUE_FIELD``.

:func:`generic_parts` and :func:`generic_fields` turn those tables into bytes and back; types
with a variable layout (optional extras, lists in the value) override ``_parts`` and
``_fields``. Zero-arg ``super()`` does not work in slotted dataclasses before Python 3.14, so
overrides call these module functions instead.

Decoding never copies: byte fields are memoryview slices of the frame (see ``frame.py``).
Every malformed input raises :class:`CodecError` naming the message type and the field.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, NamedTuple, Self

from dcpkv.core.status import Status
from dcpkv.protocol.constants import MAX_KEY_LEN, Magic, Opcode
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import Bytes, Frame, encode_frame, encode_stream_id

REQUEST_MAGICS = frozenset({Magic.ClientRequest, Magic.AltClientRequest, Magic.ServerRequest})
_STATUS_BY_VALUE = {s.value: s for s in Status}
_OPCODE_BY_VALUE = {o.value: o for o in Opcode}


class Part(IntEnum):
    """Whether a key or value may appear."""

    NONE = 0
    OPTIONAL = 1
    REQUIRED = 2


def as_status(value: int) -> int:
    """The :class:`Status` member for a known code, the plain int otherwise (newer servers
    send codes this table does not list; a client must still read the response)."""
    return _STATUS_BY_VALUE.get(value, value)


def opcode_name(value: int) -> str:
    op = _OPCODE_BY_VALUE.get(value)
    return op.name if op is not None else f"0x{value:02x}"


def einval(what: str, message: str) -> CodecError:
    return CodecError(Status.Einval, f"{what}: {message}")


def text(data: Bytes, what: str) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError:
        raise einval(what, "is not valid UTF-8") from None


def unpack_exact(layout: struct.Struct, data: Bytes, what: str) -> tuple[Any, ...]:
    if len(data) != layout.size:
        raise einval(what, f"must be {layout.size} bytes, got {len(data)}")
    return layout.unpack(data)


def pack(layout: struct.Struct, what: str, *values: Any) -> bytes:
    try:
        return layout.pack(*values)
    except struct.error as exc:
        raise einval(what, f"a field is out of range or of the wrong type ({exc})") from None


class ValueCodec(NamedTuple):
    """A value's layout as two functions, each given the field's name for its errors
    (:class:`CodecError` on a malformed value)."""

    encode: Callable[[Any, str], Bytes]
    decode: Callable[[Bytes, str], Any]


@dataclass(slots=True, kw_only=True)
class Message:
    """Fields common to every message; see the module docstring for the class variables."""

    OPCODE: ClassVar[int]
    EXTRAS: ClassVar[struct.Struct | None] = None
    EXTRAS_FIELDS: ClassVar[tuple[str, ...]] = ()
    KEY: ClassVar[Part] = Part.NONE
    KEY_FIELD: ClassVar[str] = "key"
    KEY_TEXT: ClassVar[bool] = False
    VALUE: ClassVar[Part] = Part.NONE
    VALUE_FIELD: ClassVar[str] = "value"
    VALUE_TEXT: ClassVar[bool] = False
    VALUE_STRUCT: ClassVar[struct.Struct | None] = None
    VALUE_FIELDS: ClassVar[tuple[str, ...]] = ()
    VALUE_CODEC: ClassVar[ValueCodec | None] = None

    opaque: int = 0
    cas: int = 0
    datatype: int = 0

    @property
    def opcode(self) -> int:
        return self.OPCODE

    def encode(self) -> bytes:
        """The message's frame; :class:`Request` and :class:`Response` know their magic."""
        raise NotImplementedError

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        return generic_parts(self)

    @classmethod
    def _fields(cls, frame: Frame) -> dict[str, Any]:
        return generic_fields(cls, frame)

    @classmethod
    def _what(cls) -> str:
        return cls.__name__


def generic_parts(msg: Message) -> tuple[Bytes, Bytes, Bytes]:
    """(extras, key, value) from the class's layout tables."""
    cls = type(msg)
    what = cls.__name__
    extras: Bytes = b""
    if cls.EXTRAS is not None:
        extras = pack(cls.EXTRAS, f"{what} extras", *[getattr(msg, f) for f in cls.EXTRAS_FIELDS])
    key: Bytes = b""
    if cls.KEY:
        raw_key = getattr(msg, cls.KEY_FIELD)  # str when KEY_TEXT, else bytes
        key = raw_key.encode() if cls.KEY_TEXT else raw_key
        if cls.KEY is Part.REQUIRED and not key:
            raise einval(f"{what} {cls.KEY_FIELD}", "is required")
    value: Bytes = b""
    if cls.VALUE_STRUCT is not None:
        value = pack(
            cls.VALUE_STRUCT, f"{what} value", *[getattr(msg, f) for f in cls.VALUE_FIELDS]
        )
    elif cls.VALUE_CODEC is not None:
        field = cls.VALUE_FIELD
        value = cls.VALUE_CODEC.encode(getattr(msg, field), f"{what} {field}")
    elif cls.VALUE:
        raw_value = getattr(msg, cls.VALUE_FIELD)  # str when VALUE_TEXT, else bytes
        value = raw_value.encode() if cls.VALUE_TEXT else raw_value
        if cls.VALUE is Part.REQUIRED and not value:
            raise einval(f"{what} {cls.VALUE_FIELD}", "is required")
    return extras, key, value


def generic_fields(cls: type[Message], frame: Frame) -> dict[str, Any]:
    """Message-specific fields of ``frame`` by the class's layout tables, strictly checked."""
    what = cls.__name__
    fields: dict[str, Any] = {}
    if cls.EXTRAS is not None:
        values = unpack_exact(cls.EXTRAS, frame.extras, f"{what} extras")
        fields.update(zip(cls.EXTRAS_FIELDS, values, strict=True))
    elif frame.extras:
        raise einval(f"{what} extras", f"must be empty, got {len(frame.extras)} bytes")
    fields.update(key_field(cls, frame.key))
    if cls.VALUE_STRUCT is not None:
        values = unpack_exact(cls.VALUE_STRUCT, frame.value, f"{what} value")
        fields.update(zip(cls.VALUE_FIELDS, values, strict=True))
    elif cls.VALUE_CODEC is not None:
        field = cls.VALUE_FIELD
        fields[field] = cls.VALUE_CODEC.decode(frame.value, f"{what} {field}")
    else:
        fields.update(value_field(cls, frame.value))
    return fields


def no_extras(cls: type[Message], frame: Frame) -> None:
    if frame.extras:
        raise einval(f"{cls.__name__} extras", f"must be empty, got {len(frame.extras)} bytes")


def key_field(cls: type[Message], key: Bytes) -> dict[str, Any]:
    what = cls.__name__
    if not cls.KEY:
        if key:
            raise einval(f"{what} key", f"must be empty, got {len(key)} bytes")
        return {}
    if cls.KEY is Part.REQUIRED and not key:
        raise einval(f"{what} {cls.KEY_FIELD}", "is required (empty key)")
    return {cls.KEY_FIELD: text(key, f"{what} {cls.KEY_FIELD}") if cls.KEY_TEXT else key}


def value_field(cls: type[Message], value: Bytes) -> dict[str, Any]:
    what = cls.__name__
    if not cls.VALUE:
        if value:
            raise einval(f"{what} value", f"must be empty, got {len(value)} bytes")
        return {}
    if cls.VALUE is Part.REQUIRED and not value:
        raise einval(f"{what} {cls.VALUE_FIELD}", "is required (empty value)")
    return {cls.VALUE_FIELD: text(value, f"{what} {cls.VALUE_FIELD}") if cls.VALUE_TEXT else value}


@dataclass(slots=True, kw_only=True)
class Request(Message):
    """A request (magic 0x80, or 0x08 when a DCP stream id rides in the framing extras)."""

    vbucket: int = 0
    stream_id: int | None = None

    def _magic(self) -> int:
        return Magic.ClientRequest

    def encode(self) -> bytes:
        extras, key, value = self._parts()
        framing = b"" if self.stream_id is None else encode_stream_id(self.stream_id)
        return encode_frame(
            self._magic(),
            self.opcode,
            key=key,
            extras=extras,
            value=value,
            vbucket=self.vbucket,
            opaque=self.opaque,
            cas=self.cas,
            datatype=self.datatype,
            framing_extras=framing,
        )

    @classmethod
    def decode(cls, frame: Frame) -> Self:
        check_frame(cls, frame, request=True)
        return cls(
            opaque=frame.opaque,
            cas=frame.cas,
            datatype=frame.datatype,
            vbucket=frame.vbucket,
            stream_id=frame.stream_id,
            **cls._fields(frame),
        )


@dataclass(slots=True, kw_only=True)
class Response(Message):
    """A response (magic 0x81). ``STATUSES`` lists the statuses whose body this type reads;
    any other status is decoded as a :class:`GenericResponse` by the dispatcher."""

    STATUSES: ClassVar[frozenset[int]] = frozenset({Status.Success})

    status: int = Status.Success

    def _magic(self) -> int:
        return Magic.ClientResponse

    def encode(self) -> bytes:
        extras, key, value = self._parts()
        return encode_frame(
            self._magic(),
            self.opcode,
            key=key,
            extras=extras,
            value=value,
            status=self.status,
            opaque=self.opaque,
            cas=self.cas,
            datatype=self.datatype,
        )

    @classmethod
    def decode(cls, frame: Frame) -> Self:
        check_frame(cls, frame, request=False)
        if frame.status not in cls.STATUSES:
            raise einval(f"{cls.__name__} status", f"0x{frame.status:02x} has no body of this type")
        return cls(
            opaque=frame.opaque,
            cas=frame.cas,
            datatype=frame.datatype,
            status=as_status(frame.status),
            **cls._fields(frame),
        )


def check_frame(cls: type[Message], frame: Frame, *, request: bool) -> None:
    if (frame.magic in REQUEST_MAGICS) is not request:
        kind = "request" if request else "response"
        raise einval(cls.__name__, f"magic 0x{frame.magic:02x} is not a {kind} magic")
    opcode = getattr(cls, "OPCODE", None)
    if opcode is not None and frame.opcode != opcode:
        raise einval(
            cls.__name__, f"opcode {opcode_name(frame.opcode)} is not {opcode_name(opcode)}"
        )


@dataclass(slots=True, kw_only=True)
class GenericResponse(Response):
    """Any response without a typed body: errors of every opcode (their value is usually text,
    or the cluster map for NotMyVbucket) and the empty successes (Noop, Flush, DCP Open...).
    Everything is kept raw."""

    opcode: int  # an instance field here, a property elsewhere
    to_server: bool = False  # answers a server request: magic 0x83
    extras: Bytes = b""
    key: Bytes = b""
    value: Bytes = b""

    def _magic(self) -> int:
        return Magic.ServerResponse if self.to_server else Magic.ClientResponse

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        return self.extras, self.key, self.value

    @classmethod
    def decode(cls, frame: Frame) -> Self:
        check_frame(cls, frame, request=False)
        if len(frame.key) > MAX_KEY_LEN:  # only reachable with a hand-built Frame
            raise einval("GenericResponse key", "too long")
        return cls(
            opcode=_OPCODE_BY_VALUE.get(frame.opcode, frame.opcode),
            opaque=frame.opaque,
            cas=frame.cas,
            datatype=frame.datatype,
            status=as_status(frame.status),
            to_server=frame.magic == Magic.ServerResponse,
            extras=frame.extras,
            key=frame.key,
            value=frame.value,
        )

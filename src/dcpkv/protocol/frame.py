"""Frames: the 24-byte header plus body, and an incremental, zero-copy frame parser.

Theory of operation
-------------------
Every message on the wire is a 24-byte header followed by ``total body length`` bytes, laid out
as framing extras, extras, key, value. Classic magics (0x80-0x83) have a two-byte key length and
no framing extras; the "flex" magics (0x08 request, 0x18 response) split that field into a
one-byte framing-extras length and a one-byte key length.

Framing extras are a sequence of items. Each starts with a byte whose high nibble is the id and
low nibble the length; a nibble of 15 means "read one more byte and add 15". We understand
request id 2 (DCP stream id, 2 bytes) and response id 0 (server duration, 2 bytes, kept raw);
other ids are checked for shape and kept in ``Frame.framing_extras`` untouched.

:class:`FrameParser` is sans-I/O: hand it whatever chunks arrive and iterate the frames it
returns. It validates each header *before* waiting for the body, so a hostile length never
makes it buffer more than one legal frame (24 + 255 + 255 + 250 + ``max_value_len`` bytes).

Copies: immutable ``bytes`` fed in are never copied when a frame lies inside one chunk; the
``extras``, ``key`` and ``value`` of a frame are read-only memoryview slices of that chunk.
Mutable input (``bytearray``, writable memoryview) is copied once on entry, because the caller
may reuse it. A frame that straddles chunks is assembled once with one join. Holding a frame's
slices keeps its whole chunk alive: call ``bytes()`` on anything kept for long.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from dcpkv.core.status import Status
from dcpkv.protocol.constants import (
    DEFAULT_MAX_VALUE_LEN,
    HEADER_LEN,
    MAX_KEY_LEN,
    FramingId,
    Magic,
)
from dcpkv.protocol.errors import CodecError

Bytes = bytes | memoryview
_T = TypeVar("_T")
# a caller's fast path for :meth:`FrameParser.feed_runs`: (chunk, position, value limit) to
# (the items it took, the position after them)
RunScanner = Callable[[memoryview, int, int], tuple[list[_T], int]]


def chunk_bytes(buf: memoryview) -> bytes:
    """The bytes a scanner's chunk views, to slice keys and values from (one copy each, no
    memoryview): the chunk's own ``bytes`` object when it views all of one, else a copy."""
    data = buf.obj
    return data if type(data) is bytes and len(data) == len(buf) else bytes(buf)


# magic, opcode, key length, extras length, datatype, vbucket/status, body, opaque, cas
HEADER = struct.Struct(">BBHBBHIIQ")
# the flex form: framing-extras length and key length are one byte each
FLEX_HEADER = struct.Struct(">BBBBBBHIIQ")
_U16 = struct.Struct(">H")
_BODY_LENGTH = struct.Struct(">I")  # at offset 8 of a header of either form

_REQUESTS = frozenset({Magic.ClientRequest, Magic.ServerRequest, Magic.AltClientRequest})
_FLEX_OF = {
    Magic.ClientRequest: Magic.AltClientRequest,
    Magic.ClientResponse: Magic.AltClientResponse,
}
# index by magic byte: 0 unknown, 1 classic, 2 flex (a list beats a dict on the hot path)
_MAGIC_KIND = [0] * 256
for _m in (Magic.ClientRequest, Magic.ClientResponse, Magic.ServerRequest, Magic.ServerResponse):
    _MAGIC_KIND[_m] = 1
_MAGIC_KIND[Magic.AltClientRequest] = 2
_MAGIC_KIND[Magic.AltClientResponse] = 2
_IS_REQUEST = [m in _REQUESTS for m in range(256)]  # by magic byte
_EMPTY = memoryview(b"")


@dataclass(slots=True)
class Frame:
    """One decoded frame. ``vbucket`` is set for requests, ``status`` for responses."""

    magic: int
    opcode: int
    datatype: int
    vbucket: int
    status: int
    opaque: int
    cas: int
    framing_extras: Bytes
    extras: Bytes
    key: Bytes
    value: Bytes
    stream_id: int | None = None
    server_duration: int | None = None  # raw encoded form, responses only

    @property
    def is_request(self) -> bool:
        return self.magic in _REQUESTS

    @property
    def size(self) -> int:
        return (
            HEADER_LEN
            + len(self.framing_extras)
            + len(self.extras)
            + len(self.key)
            + len(self.value)
        )


_new = object.__new__


def _classic_frame(
    magic: int, opcode: int, datatype: int, vbucket: int, status: int, opaque: int, cas: int,
    extras: memoryview, key: memoryview, value: memoryview,
) -> Frame:  # fmt: skip
    """A :class:`Frame` without framing extras, built without ``Frame.__init__``: the parser's
    fast path (a call through the type costs twice these stores). Sets every field (a test
    holds it to ``dataclasses.fields(Frame)``)."""
    f = _new(Frame)
    f.magic = magic
    f.opcode = opcode
    f.datatype = datatype
    f.vbucket = vbucket
    f.status = status
    f.opaque = opaque
    f.cas = cas
    f.framing_extras = _EMPTY
    f.extras = extras
    f.key = key
    f.value = value
    f.stream_id = None
    f.server_duration = None
    return f


def body_length(data: Bytes, pos: int = 0) -> int:
    """The total body length of the frame whose header starts at ``pos`` (either form: the
    field is at offset 8 in both), read without unpacking the rest of the header."""
    return _BODY_LENGTH.unpack_from(data, pos + 8)[0]


def encode_framing_item(item_id: int, data: bytes) -> bytes:
    """One framing-extras item (ids and lengths of 15 or more use the escape byte)."""
    if not 0 <= item_id <= 15 + 255 or len(data) > 15 + 255:
        raise CodecError(Status.Einval, f"framing item id {item_id} / length {len(data)} too big")
    head = bytearray(1)
    id_nibble = item_id if item_id < 15 else 15
    len_nibble = len(data) if len(data) < 15 else 15
    head[0] = id_nibble << 4 | len_nibble
    if item_id >= 15:
        head.append(item_id - 15)
    if len(data) >= 15:
        head.append(len(data) - 15)
    return bytes(head) + data


def encode_stream_id(stream_id: int) -> bytes:
    if not 0 <= stream_id <= 0xFFFF:
        raise CodecError(Status.Einval, f"stream_id {stream_id} is not an unsigned 16-bit value")
    return encode_framing_item(FramingId.RequestDcpStreamId, _U16.pack(stream_id))


def tag_stream_id(frame: bytes, stream_id: int) -> bytes:
    """A classic request frame (magic 0x80, key under 256 bytes) rewritten as the flex
    request frame (magic 0x08) carrying ``stream_id`` in its framing extras: how a producer
    tags every message of a stream opened with a stream id."""
    return with_framing(frame, encode_stream_id(stream_id))


def with_framing(frame: bytes, framing: bytes) -> bytes:
    """A classic request frame (magic 0x80, key under 256 bytes) rewritten as the flex request
    frame (magic 0x08) carrying ``framing`` (encoded framing-extras items)."""
    key_len, body = int.from_bytes(frame[2:4], "big"), int.from_bytes(frame[8:12], "big")
    head = (
        bytes((Magic.AltClientRequest, frame[1], len(framing), key_len))
        + frame[4:8]
        + (body + len(framing)).to_bytes(4, "big")
        + frame[12:24]
    )
    return head + framing + frame[24:]


def encode_frame(
    magic: int,
    opcode: int,
    *,
    key: Bytes = b"",
    extras: Bytes = b"",
    value: Bytes = b"",
    vbucket: int = 0,
    status: int = 0,
    opaque: int = 0,
    cas: int = 0,
    datatype: int = 0,
    framing_extras: Bytes = b"",
) -> bytes:
    """Bytes of one frame. With framing extras a classic magic becomes its flex twin."""
    if _MAGIC_KIND[magic & 0xFF] == 0 or magic > 0xFF:
        raise CodecError(Status.Einval, f"magic 0x{magic:02x} is not a known magic")
    if len(key) > MAX_KEY_LEN:
        raise CodecError(Status.Einval, f"key of {len(key)} bytes exceeds {MAX_KEY_LEN}")
    if len(extras) > 0xFF:
        raise CodecError(Status.Einval, f"extras of {len(extras)} bytes exceed 255")
    vb_or_status = vbucket if magic in _REQUESTS else status
    body = len(framing_extras) + len(extras) + len(key) + len(value)
    try:
        if framing_extras or _MAGIC_KIND[magic] == 2:
            if len(framing_extras) > 0xFF:
                raise CodecError(Status.Einval, "framing extras exceed 255 bytes")
            magic = _FLEX_OF.get(magic, magic)  # type: ignore[call-overload]
            if _MAGIC_KIND[magic] != 2:
                raise CodecError(Status.Einval, f"magic 0x{magic:02x} cannot carry framing extras")
            header = FLEX_HEADER.pack(
                magic, opcode, len(framing_extras), len(key), len(extras), datatype,
                vb_or_status, body, opaque, cas,
            )  # fmt: skip
        else:
            header = HEADER.pack(
                magic, opcode, len(key), len(extras), datatype, vb_or_status, body, opaque, cas
            )
    except struct.error as exc:
        raise CodecError(Status.Einval, f"header field out of range: {exc}") from None
    return b"".join((header, framing_extras, extras, key, value))


def _framing_item(framing: memoryview, pos: int) -> tuple[int, int, int]:
    """(item id, data length, offset of its data) of the item whose tag byte is at ``pos``."""
    end = len(framing)
    tag = framing[pos]
    pos += 1
    item_id, length = tag >> 4, tag & 0x0F
    if item_id == 15:
        if pos >= end:
            raise CodecError(Status.Einval, "framing extras: escaped id is truncated")
        item_id += framing[pos]
        pos += 1
    if length == 15:
        if pos >= end:
            raise CodecError(Status.Einval, "framing extras: escaped length is truncated")
        length += framing[pos]
        pos += 1
    if pos + length > end:
        raise CodecError(Status.Einval, f"framing extras: item {item_id} overruns the frame")
    return item_id, length, pos


def framing_items(framing: Bytes) -> Iterator[tuple[int, memoryview]]:
    """(id, data) of each framing-extras item, in order; a malformed item raises
    :class:`CodecError` (the parser has checked the shape of a frame's items already)."""
    view = memoryview(framing)
    pos = 0
    while pos < len(view):
        item_id, length, pos = _framing_item(view, pos)
        yield item_id, view[pos : pos + length]
        pos += length


# The two-byte items we read, by (is a request, id): what the error calls them
_KNOWN_ITEMS: dict[tuple[bool, int], str] = {
    (True, FramingId.RequestDcpStreamId): "stream id",
    (False, FramingId.ResponseServerDuration): "duration",
}


def _parse_framing(framing: memoryview, request: bool) -> tuple[int | None, int | None]:
    """(stream id, server duration) from framing extras, checking every item's shape."""
    found: dict[int, int] = {}
    pos = 0
    while pos < len(framing):
        item_id, length, pos = _framing_item(framing, pos)
        name = _KNOWN_ITEMS.get((request, item_id))
        if name is not None:
            if length != 2:
                raise CodecError(Status.Einval, f"framing extras: {name} of {length} bytes")
            found[item_id] = _U16.unpack_from(framing, pos)[0]
        pos += length
    if request:
        return found.get(FramingId.RequestDcpStreamId), None
    return None, found.get(FramingId.ResponseServerDuration)


class FrameParser:
    """Incremental parser: ``for frame in parser.feed(chunk): ...``.

    ``feed`` buffers its argument at once and returns an iterator that parses lazily; frames
    not taken from one iterator are produced by the next. After a :class:`CodecError` the byte
    stream cannot be resynchronised: the parser keeps raising and the connection should close.
    """

    __slots__ = ("_buf", "_error", "_max_value", "_need", "_pos", "_tail", "_tail_len")

    def __init__(self, max_value_len: int = DEFAULT_MAX_VALUE_LEN) -> None:
        self._max_value = max_value_len
        self._buf: memoryview = _EMPTY  # the chunk being parsed
        self._pos = 0
        self._tail: list[bytes | memoryview] = []  # chunks after _buf, not yet joined
        self._tail_len = 0
        self._need = HEADER_LEN  # bytes from _pos needed before the next frame can be parsed
        self._error: CodecError | None = None

    @property
    def max_value_len(self) -> int:
        """The largest value a frame may carry; a longer one is refused from its header."""
        return self._max_value

    @max_value_len.setter
    def max_value_len(self, limit: int) -> None:
        self._max_value = limit

    def release(self) -> None:
        """Drop every buffered byte at once (the connection is gone)."""
        self._buf, self._pos, self._tail, self._tail_len = _EMPTY, 0, [], 0
        self._need = HEADER_LEN

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos + self._tail_len

    def buffered_views(self) -> list[Bytes]:
        """The bytes received but not yet returned as frames, as the chunks hold them (no
        copy; a frame may straddle two of them)."""
        return [self._buf[self._pos :], *self._tail]

    def take_buffered(self) -> bytes:
        """Every byte received but not yet returned as a frame, which the parser no longer
        holds: its caller serves them as a chunk just read (whose rest, should it stop
        early, it feeds back)."""
        if self._error is not None:
            raise CodecError(self._error.status, self._error.message)
        data = b"".join(self.buffered_views())
        self.release()
        return data

    def peek(self, n: int = HEADER_LEN) -> bytes:
        """Up to ``n`` bytes received but not yet returned as a frame (e.g. a bad header)."""
        head = bytes(self._buf[self._pos : self._pos + n])
        for chunk in self._tail:
            if len(head) >= n:
                break
            head += bytes(chunk[: n - len(head)])
        return head

    def feed(self, data: bytes | bytearray | memoryview) -> Iterator[Frame]:
        self._take(data)
        return self._frames()

    def feed_runs(
        self, data: bytes | bytearray | memoryview, scan: RunScanner[_T]
    ) -> Iterator[list[_T] | Frame]:
        """``feed`` with a fast path of the caller's, for a stream of one frame shape it can
        decode better than a :class:`Frame` (e.g. DCP mutations). At every frame boundary
        ``scan(chunk, pos, max_value_len)`` may take a run of whole frames that lie in the
        current chunk, returning them as items and the position after them; it must take only
        frames this parser would accept, and stop at the first it does not want. Each run
        comes out as one list; every frame it leaves comes out as a Frame, in wire order."""
        self._take(data)
        return self._parse_with(lambda: self._runs(scan))

    def _take(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise CodecError(self._error.status, self._error.message)
        if data:
            chunk = data if type(data) is bytes else bytes(data)
            if self._pos == len(self._buf) and not self._tail:
                self._buf, self._pos = memoryview(chunk), 0
            else:
                self._tail.append(chunk)
                self._tail_len += len(chunk)

    def _next_chunk(self) -> bool:
        """Move to the next chunk when the current one ends exactly at a frame boundary: used
        as is, no copy. False when there is nothing to move to."""
        if self._pos != len(self._buf) or not self._tail:
            return False
        self._buf, self._pos = memoryview(self._tail.pop(0)), 0
        self._tail_len -= len(self._buf)
        return True

    def _runs(self, scan: RunScanner[_T]) -> Iterator[list[_T]]:
        """The caller's fast path, run after run (a scanner may cut its runs short: it is
        asked again until it takes nothing)."""
        while True:
            items, pos = scan(self._buf, self._pos, self._max_value)
            if not items:
                return
            self._pos = pos
            yield items

    def _frames(self) -> Iterator[Frame]:
        return self._parse_with(self._whole_classic_frames)

    def _parse_with(self, fast: Callable[[], Iterator[_T]]) -> Iterator[_T | Frame]:
        """Whatever the fast path takes, then one frame by the general path (flex, split
        across chunks, errors), and again, until the bytes run out."""
        if self._error is not None:
            raise CodecError(self._error.status, self._error.message)
        next_frame = self._next_frame  # one error check for the loop, not one per frame
        try:
            while True:
                yield from fast()
                if self._next_chunk():
                    continue
                frame = next_frame()
                if frame is None:
                    return
                yield frame
        except CodecError as exc:
            self._error = exc
            raise

    def _whole_classic_frames(self) -> Iterator[Frame]:
        """The fast path, one loop with no call per frame but the Frame's: classic frames
        that lie wholly in the current chunk and pass every check. It stops at the first that
        does not; the general path then parses it (or raises its error)."""
        buf, pos = self._buf, self._pos
        end, max_value, unpack = len(buf), self._max_value, HEADER.unpack_from
        kinds, requests, make = _MAGIC_KIND, _IS_REQUEST, _classic_frame
        while end - pos >= HEADER_LEN:
            magic, opcode, keylen, extlen, datatype, vbs, body, opaque, cas = unpack(buf, pos)
            size = HEADER_LEN + body
            value_len = body - extlen - keylen
            if (kinds[magic] != 1 or keylen > MAX_KEY_LEN or size > end - pos
                    or value_len < 0 or value_len > max_value):  # fmt: skip
                return
            e = pos + HEADER_LEN
            k = e + extlen
            v = k + keylen
            pos += size
            if requests[magic]:
                frame = make(magic, opcode, datatype, vbs, 0, opaque, cas,
                             buf[e:k], buf[k:v], buf[v:pos])  # fmt: skip
            else:
                frame = make(magic, opcode, datatype, 0, vbs, opaque, cas,
                             buf[e:k], buf[k:v], buf[v:pos])  # fmt: skip
            self._pos = pos
            yield frame
            if self._pos != pos or self._buf is not buf:
                return  # moved while we were suspended (feed, next_frame): start afresh

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until more bytes arrive."""
        if self._error is not None:
            raise CodecError(self._error.status, self._error.message)
        try:
            return self._next_frame()
        except CodecError as exc:
            self._error = exc
            raise

    def _next_frame(self) -> Frame | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < self._need:
            if len(buf) - pos + self._tail_len < self._need:
                return None
            buf, pos = self._join()
        frame, size = self._parse(buf, pos)
        if frame is None:
            self._need = size
            if len(buf) - pos + self._tail_len < size:
                return None
            buf, pos = self._join()
            frame, size = self._parse(buf, pos)
            assert frame is not None
        self._pos = pos + size
        self._need = HEADER_LEN
        self._next_chunk()
        return frame

    def _join(self) -> tuple[memoryview, int]:
        joined = b"".join([self._buf[self._pos :], *self._tail])
        self._buf, self._pos = memoryview(joined), 0
        self._tail, self._tail_len = [], 0
        return self._buf, 0

    def _parse(self, buf: memoryview, pos: int) -> tuple[Frame | None, int]:
        """(frame, its size), or (None, size needed) when the body is not all here yet."""
        magic, opcode, keylen, extlen, datatype, vbs, bodylen, opaque, cas = HEADER.unpack_from(
            buf, pos
        )
        kind = _MAGIC_KIND[magic]
        if kind == 1:
            framelen = 0
        elif kind == 2:
            framelen, keylen = keylen >> 8, keylen & 0xFF
        else:
            raise CodecError(Status.Einval, f"magic 0x{magic:02x} is not a known magic")
        if keylen > MAX_KEY_LEN:
            raise CodecError(Status.Einval, f"key length {keylen} exceeds {MAX_KEY_LEN}")
        valuelen = bodylen - framelen - extlen - keylen
        if valuelen < 0:
            raise CodecError(
                Status.Einval,
                f"total body length {bodylen} is less than framing extras {framelen} + "
                f"extras {extlen} + key {keylen}",
            )
        if valuelen > self._max_value:
            raise CodecError(
                Status.E2big, f"value length {valuelen} exceeds the limit {self._max_value}"
            )
        size = HEADER_LEN + bodylen
        if len(buf) - pos < size:
            return None, size
        p = pos + HEADER_LEN
        request = magic in _REQUESTS
        stream_id = duration = None
        if framelen:
            framing = buf[p : p + framelen]
            stream_id, duration = _parse_framing(framing, request)
            p += framelen
        else:
            framing = _EMPTY
        extras = buf[p : p + extlen]
        p += extlen
        key = buf[p : p + keylen]
        p += keylen
        value = buf[p : pos + size]
        if request:
            frame = Frame(
                magic, opcode, datatype, vbs, 0, opaque, cas, framing, extras, key, value,
                stream_id, duration,
            )  # fmt: skip
        else:
            frame = Frame(
                magic, opcode, datatype, 0, vbs, opaque, cas, framing, extras, key, value,
                stream_id, duration,
            )  # fmt: skip
        return frame, size

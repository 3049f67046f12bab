"""Sub-document requests and answers (opcodes 0xc5-0xd2): the bytes, as Couchbase's
BinaryProtocol.md and SubDocument.md lay them out.

Theory of operation
-------------------
Single-path requests (Get, Exists, DictAdd ... Counter, GetCount) carry the path and its
flags in the extras and the path then the value in the body::

    extras  path length u16, path flags u8, [expiry u32], [doc flags u8]   (3, 4, 7 or 8 bytes)
    key     the document id
    value   path, then the value (mutations)

Multi-path requests carry up to 16 specs in the value; their extras are only the optional
doc flags (MultiLookup: 0 or 1 byte) or expiry and doc flags (MultiMutation: 0, 1, 4 or 5)::

    lookup spec    opcode u8, flags u8, path length u16, path
    mutation spec  opcode u8, flags u8, path length u16, value length u32, path, value

Answers: a single path answers its status and value. A multi-lookup answers, per spec,
``status u16, length u32, value``; the overall status is Success, MultiPathFailure or a
document-level error. A multi-mutation answers Success and, per spec that has a value (a
counter), ``index u8, status u16, length u32, value``; or MultiPathFailure with just the
``index u8, status u16`` of the first spec that failed. Both decode into one
:class:`SubdocRequest` whose ``specs`` the engine applies; single paths are one spec.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Self

from dcpkv.protocol.base import REQUEST_MAGICS, Request, check_frame, einval
from dcpkv.protocol.constants import Opcode
from dcpkv.protocol.frame import Bytes, Frame

_SINGLE = struct.Struct(">HB")
_EXPIRY = struct.Struct(">I")
_LOOKUP_SPEC = struct.Struct(">BBH")
_MUTATION_SPEC = struct.Struct(">BBHI")
_LOOKUP_RESULT = struct.Struct(">HI")
_MUTATION_RESULT = struct.Struct(">BHI")
_FAILURE = struct.Struct(">BH")

SINGLE_OPS = frozenset({
    Opcode.SubdocGet, Opcode.SubdocExists, Opcode.SubdocDictAdd, Opcode.SubdocDictUpsert,
    Opcode.SubdocDelete, Opcode.SubdocReplace, Opcode.SubdocArrayPushLast,
    Opcode.SubdocArrayPushFirst, Opcode.SubdocArrayInsert, Opcode.SubdocArrayAddUnique,
    Opcode.SubdocCounter, Opcode.SubdocGetCount,
})  # fmt: skip
SINGLE_LOOKUPS = frozenset({Opcode.SubdocGet, Opcode.SubdocExists, Opcode.SubdocGetCount})
ALL_OPS = SINGLE_OPS | {Opcode.SubdocMultiLookup, Opcode.SubdocMultiMutation}
LOOKUP_OPS = SINGLE_LOOKUPS | {Opcode.SubdocMultiLookup}  # the rest change the document


@dataclass(frozen=True, slots=True)
class Spec:
    """One path operation: its opcode (a sub-document opcode, or Get/Set/Delete for the
    whole document inside a multi-path request), path flags, path and value."""

    opcode: int
    flags: int = 0
    path: str = ""
    value: bytes = b""

    @property
    def is_xattr(self) -> bool:
        return bool(self.flags & 0x04)


@dataclass(slots=True, kw_only=True)
class SubdocRequest(Request):
    opcode: int  # an instance field here: one type for every sub-document opcode
    key: Bytes
    specs: tuple[Spec, ...] = ()
    doc_flags: int = 0
    expiry: int = 0

    @property
    def is_lookup(self) -> bool:
        return self.opcode == Opcode.SubdocMultiLookup or self.opcode in SINGLE_LOOKUPS

    @property
    def is_multi(self) -> bool:
        return self.opcode in (Opcode.SubdocMultiLookup, Opcode.SubdocMultiMutation)

    def _parts(self) -> tuple[Bytes, Bytes, Bytes]:
        tail = (_EXPIRY.pack(self.expiry) if self.expiry else b"") + (
            bytes([self.doc_flags]) if self.doc_flags else b""
        )
        if not self.is_multi:
            (s,) = self.specs
            path = s.path.encode()
            return _SINGLE.pack(len(path), s.flags) + tail, self.key, path + s.value
        if self.opcode == Opcode.SubdocMultiLookup:
            body = b"".join(
                _LOOKUP_SPEC.pack(s.opcode, s.flags, len(p)) + p
                for s in self.specs
                for p in (s.path.encode(),)
            )
        else:
            body = b"".join(
                _MUTATION_SPEC.pack(s.opcode, s.flags, len(p), len(s.value)) + p + s.value
                for s in self.specs
                for p in (s.path.encode(),)
            )
        return tail, self.key, body

    @classmethod
    def decode(cls, frame: Frame) -> Self:
        if frame.magic not in REQUEST_MAGICS or frame.opcode not in ALL_OPS:
            check_frame(cls, frame, request=True)
            raise einval("SubdocRequest", f"opcode 0x{frame.opcode:02x} is not sub-document")
        if not frame.key:
            raise einval("SubdocRequest key", "is required (empty key)")
        if frame.opcode == Opcode.SubdocMultiLookup:
            doc_flags, expiry = _tail(frame.extras, lookup=True), 0
            specs = _lookup_specs(frame.value)
        elif frame.opcode == Opcode.SubdocMultiMutation:
            expiry, doc_flags = _multi_mutation_extras(frame.extras)
            specs = _mutation_specs(frame.value)
        else:
            specs, expiry, doc_flags = _single(frame)
        return cls(
            opcode=frame.opcode, opaque=frame.opaque, cas=frame.cas, datatype=frame.datatype,
            vbucket=frame.vbucket, stream_id=frame.stream_id, key=frame.key,
            specs=tuple(specs), doc_flags=doc_flags, expiry=expiry,
        )  # fmt: skip


def _text(raw: Bytes) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        raise einval("SubdocRequest path", "is not UTF-8") from None


def _single(frame: Frame) -> tuple[list[Spec], int, int]:
    extras = frame.extras
    if len(extras) not in (3, 4, 7, 8):
        raise einval("SubdocRequest extras", f"must be 3, 4, 7 or 8 bytes, got {len(extras)}")
    path_len, flags = _SINGLE.unpack_from(extras)
    expiry = _EXPIRY.unpack_from(extras, 3)[0] if len(extras) >= 7 else 0
    doc_flags = extras[-1] if len(extras) in (4, 8) else 0
    if path_len > len(frame.value):
        raise einval("SubdocRequest path", f"length {path_len} runs past the body")
    path = _text(frame.value[:path_len])
    return [Spec(frame.opcode, flags, path, bytes(frame.value[path_len:]))], expiry, doc_flags


def _tail(extras: Bytes, *, lookup: bool) -> int:
    if len(extras) > 1:
        raise einval("SubdocMultiLookup extras", f"must be 0 or 1 bytes, got {len(extras)}")
    return extras[0] if extras else 0


def _multi_mutation_extras(extras: Bytes) -> tuple[int, int]:
    if len(extras) not in (0, 1, 4, 5):
        raise einval("SubdocMultiMutation extras", f"must be 0, 1, 4 or 5 bytes, got {len(extras)}")
    expiry = _EXPIRY.unpack_from(extras)[0] if len(extras) >= 4 else 0
    doc_flags = extras[-1] if len(extras) in (1, 5) else 0
    return expiry, doc_flags


def _lookup_specs(body: Bytes) -> list[Spec]:
    specs, pos = [], 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise einval("SubdocMultiLookup specs", "truncated spec header")
        opcode, flags, path_len = _LOOKUP_SPEC.unpack_from(body, pos)
        end = pos + 4 + path_len
        if end > len(body):
            raise einval("SubdocMultiLookup specs", "a path runs past the body")
        specs.append(Spec(opcode, flags, _text(body[pos + 4 : end])))
        pos = end
    return specs


def _mutation_specs(body: Bytes) -> list[Spec]:
    specs, pos = [], 0
    while pos < len(body):
        if pos + 8 > len(body):
            raise einval("SubdocMultiMutation specs", "truncated spec header")
        opcode, flags, path_len, value_len = _MUTATION_SPEC.unpack_from(body, pos)
        start, end = pos + 8 + path_len, pos + 8 + path_len + value_len
        if end > len(body):
            raise einval("SubdocMultiMutation specs", "a path or value runs past the body")
        specs.append(Spec(opcode, flags, _text(body[pos + 8 : start]), bytes(body[start:end])))
        pos = end
    return specs


# -- answers -----------------------------------------------------------------------------------


def lookup_results(results: list[tuple[int, bytes]]) -> bytes:
    """A multi-lookup answer's value: (status, value) per spec."""
    return b"".join(_LOOKUP_RESULT.pack(st, len(v)) + v for st, v in results)


def mutation_results(results: list[tuple[int, bytes]]) -> bytes:
    """A successful multi-mutation's value: (spec index, value) of the specs with a value."""
    return b"".join(_MUTATION_RESULT.pack(i, 0, len(v)) + v for i, v in results)


def mutation_failure(index: int, status: int) -> bytes:
    return _FAILURE.pack(index, status)


def decode_lookup_results(value: Bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos < len(value):
        status, n = _LOOKUP_RESULT.unpack_from(value, pos)
        out.append((status, bytes(value[pos + 6 : pos + 6 + n])))
        pos += 6 + n
    return out

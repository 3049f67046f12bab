"""A stored value seen as a document: optional xattrs, a body, maybe Snappy-compressed.

Theory of operation
-------------------
The engine stores a value as it was accepted, with its datatype bits: Snappy (0x02) when the
bucket's compression mode kept it compressed, Xattr (0x04) when xattrs lead the value. The
common value has neither bit and costs nothing: every caller tests ``datatype & SHAPED``
first, and only a shaped value goes through :func:`unpack`.

Compression modes (a bucket setting, as in Couchbase):

======== ============================================================================
off      a compressed value from a client is inflated and stored plain; nothing is sent
         compressed
passive  a compressed value is stored as it came, and sent compressed to connections that
         negotiated Snappy (inflated for the others) -- the default
active   as passive, and a plain value is compressed before it is stored when that makes
         it smaller
======== ============================================================================

The xattr rules that belong to the document, not to a request, are here too:
:func:`for_tombstone` keeps only the system xattrs (they outlive the body, user ones do not),
:func:`carry_system_xattrs` is a full-document Set over a document that has system xattrs
(they stay; user xattrs are replaced with the document).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dcpkv.protocol import snappy, xattr

JSON, SNAPPY, XATTR = 0x01, snappy.SNAPPY, xattr.XATTR
SHAPED = SNAPPY | XATTR  # bits that make a value more than its body
# Inflating a stored value: never more than this (a stored value was checked at the door).
INFLATE_LIMIT = 1 << 31


class CompressionMode(StrEnum):
    OFF = "off"
    PASSIVE = "passive"
    ACTIVE = "active"


@dataclass(slots=True)
class Document:
    """A value taken apart: its xattrs (JSON text by key, in order), its body, and whether
    the body is JSON."""

    xattrs: xattr.Xattrs
    body: bytes
    json: bool

    def pack(self) -> tuple[bytes, int]:
        """(value, datatype), uncompressed."""
        value, has = xattr.join(self.xattrs, self.body)
        return value, (JSON if self.json else 0) | (XATTR if has else 0)


def inflate(value: bytes, datatype: int) -> tuple[bytes, int]:
    """(value, datatype) without the Snappy bit."""
    if datatype & SNAPPY:
        return snappy.inflate(value, INFLATE_LIMIT), datatype & ~SNAPPY
    return value, datatype


def unpack(value: bytes, datatype: int) -> Document:
    plain, datatype = inflate(value, datatype)
    if datatype & XATTR:
        blob, body = xattr.split(plain)
        return Document(xattr.decode(blob), body, bool(datatype & JSON))
    return Document({}, plain, bool(datatype & JSON))


def body(value: bytes, datatype: int) -> tuple[bytes, int]:
    """(body, datatype) with the xattrs cut off and the value inflated."""
    plain, datatype = inflate(value, datatype)
    if datatype & XATTR:
        return xattr.body_of(plain), datatype & ~XATTR
    return plain, datatype


def xattrs_only(value: bytes, datatype: int) -> tuple[bytes, int]:
    """(xattr blob, XATTR) or (b"", 0): a value's xattrs without its body."""
    plain, datatype = inflate(value, datatype)
    if datatype & XATTR:
        blob, _ = xattr.split(plain)
        return blob, XATTR
    return b"", 0


def for_tombstone(value: bytes | None, datatype: int) -> tuple[bytes, int]:
    """What a deletion keeps of a value: its system xattrs, if any."""
    if value is None or not datatype & XATTR:
        return b"", 0
    doc = unpack(value, datatype)
    blob = xattr.encode(xattr.system_only(doc.xattrs))
    return blob, XATTR if blob else 0


def carry_system_xattrs(
    current: bytes, current_datatype: int, value: bytes, datatype: int
) -> tuple[bytes, int]:
    """A full-document write of (value, datatype) over a document with xattrs: its system
    xattrs stay, unless the write brings xattrs of its own."""
    if datatype & XATTR:
        return value, datatype
    system = xattr.system_only(unpack(current, current_datatype).xattrs)
    if not system:
        return value, datatype
    plain, datatype = inflate(value, datatype)
    return xattr.encode(system) + plain, datatype | XATTR


def store_form(value: bytes, datatype: int, mode: CompressionMode) -> tuple[bytes, int]:
    """What the bucket keeps of an accepted (validated) value, per its compression mode."""
    if mode is CompressionMode.OFF:
        return inflate(value, datatype)
    if mode is CompressionMode.ACTIVE and not datatype & SNAPPY:
        packed = snappy.deflate_if_smaller(value)
        if packed is not None:
            return packed, datatype | SNAPPY
    return value, datatype

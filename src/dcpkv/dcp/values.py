"""What a DCP consumer is sent of a value: xattrs or not, compressed or not, body or not.

Theory of operation
-------------------
A stored value carries Snappy (0x02) and Xattr (0x04) bits (:mod:`dcpkv.engine.document`).
A producer connection sends each value shaped by what the consumer asked for:

=============================== ======================================================
consumer                        what a mutation carries
=============================== ======================================================
IncludeXattrs                   xattrs and body; without it the xattrs are cut off
NoValue (+ IncludeXattrs)       nothing (just the xattrs, datatype Xattr)
Snappy negotiated (Hello)       compressed values as stored; others inflated
force_value_compression control every value compressed when that makes it smaller
=============================== ======================================================

A deletion carries a value only to an IncludeXattrs consumer: the system xattrs the
tombstone kept. A plain value (no Snappy, no Xattr bit) is never touched unless compression
is forced: :class:`ValueShape` is built once per connection and :meth:`ValueShape.plain`
tells the encoders they may skip it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcpkv.engine import document
from dcpkv.protocol import snappy

_SNAPPY, _XATTR, _SHAPED, _JSON = document.SNAPPY, document.XATTR, document.SHAPED, document.JSON


@dataclass(frozen=True, slots=True)
class ValueShape:
    xattrs: bool = False  # IncludeXattrs
    snappy: bool = False  # Snappy negotiated with Hello
    force_compression: bool = False  # force_value_compression
    no_value: bool = False  # NoValue or NoValueWithUnderlyingDatatype
    keep_datatype: bool = False  # NoValueWithUnderlyingDatatype

    @property
    def plain(self) -> bool:
        """Plain values go out unchanged (the encoders' fast path)."""
        return not (self.force_compression or self.no_value)

    def mutation(self, value: bytes, datatype: int) -> tuple[bytes, int]:
        """(value, datatype) of a mutation of this stored value."""
        if self.no_value:
            return self._no_value(value, datatype)
        if datatype & _SHAPED:
            value, datatype = self._unshape(value, datatype)
        if self.force_compression and not datatype & _SNAPPY:
            packed = snappy.deflate_if_smaller(value)
            if packed is not None:
                return packed, datatype | _SNAPPY
        return value, datatype

    def deletion(self, value: bytes, datatype: int) -> tuple[bytes, int]:
        """(value, datatype) of a deletion: the kept system xattrs, to IncludeXattrs only."""
        if not self.xattrs or not datatype & _XATTR:
            return b"", 0
        return document.xattrs_only(value, datatype)

    def _no_value(self, value: bytes, datatype: int) -> tuple[bytes, int]:
        body_datatype = datatype & _JSON if self.keep_datatype else 0
        if self.xattrs and datatype & _XATTR:
            blob, _ = document.xattrs_only(value, datatype)
            return blob, body_datatype | _XATTR
        return b"", body_datatype

    def _unshape(self, value: bytes, datatype: int) -> tuple[bytes, int]:
        if datatype & _XATTR and not self.xattrs:
            compressed = datatype & _SNAPPY
            value, datatype = document.body(value, datatype)
            if compressed and self.snappy:
                packed = snappy.deflate_if_smaller(value)
                if packed is not None:
                    return packed, datatype | _SNAPPY
            return value, datatype
        if datatype & _SNAPPY and not self.snappy:
            return document.inflate(value, datatype)
        return value, datatype

"""What a connection may send as a value, and what it is sent: the datatype negotiation.

Theory of operation
-------------------
Hello decides which datatype bits a connection speaks: JSON (0x01) with Datatype or JSON,
Snappy (0x02) with Snappy, Xattr (0x04) with Xattr. Coming in (:func:`accept`), a bit the
connection did not negotiate is refused (Einval), a Snappy value is inflated to be validated
(a corrupt one is refused with Einval and never stored), an xattr blob is parsed to be
validated; then the bucket's compression mode decides the stored form
(:func:`dcpkv.engine.document.store_form`). Going out (:func:`for_client`), a Get sends the
body only (xattrs are read with sub-document lookups), compressed only to a connection that
negotiated Snappy; everything else is inflated.

The plain value (datatype 0 or JSON) is the fast path in both directions: one ``&`` and
nothing else.
"""

from __future__ import annotations

from dcpkv.core.status import Status
from dcpkv.engine import document
from dcpkv.engine.item import Item
from dcpkv.protocol import snappy, xattr
from dcpkv.protocol.constants import HelloFeature
from dcpkv.protocol.errors import CodecError
from dcpkv.server.connection import Connection, Reply

_SHAPED = document.SHAPED
_NEEDS = ((document.SNAPPY, HelloFeature.Snappy), (document.XATTR, HelloFeature.Xattr))
_KNOWN = document.JSON | document.SHAPED


def accept(conn: Connection, value: bytes, datatype: int) -> tuple[bytes, int]:
    """The (value, datatype) to store for a request's value; Reply(Einval) when refused."""
    if not datatype & ~document.JSON:
        if conn.bucket.compression_mode is document.CompressionMode.ACTIVE:
            return document.store_form(value, datatype, document.CompressionMode.ACTIVE)
        return value, datatype
    if datatype & ~_KNOWN:
        raise Reply(Status.Einval, f"unknown datatype bits 0x{datatype:02x}".encode())
    for bit, feature in _NEEDS:
        if datatype & bit and feature not in conn.features:
            raise Reply(Status.Einval, f"datatype {feature.name} not negotiated".encode())
    try:
        plain = value
        if datatype & document.SNAPPY:
            plain = snappy.inflate(value, conn.bucket.max_item_size)
        if datatype & document.XATTR:
            xattr.decode(xattr.split(plain)[0])
    except CodecError as exc:
        raise Reply(exc.status, exc.message.encode()) from None
    return document.store_form(value, datatype, conn.bucket.compression_mode)


def for_client(conn: Connection, item: Item) -> tuple[bytes, int]:
    """The (value, datatype) a Get answers with: the body, compressed when the item is
    stored compressed and the connection speaks Snappy; only the datatype bits the client
    negotiated (the JSON bit with Datatype or JSON)."""
    value, datatype = item.value or b"", item.datatype
    if datatype & _SHAPED:
        value, datatype = _shape(conn, value, datatype)
    return value, datatype & conn.datatype_mask


def mask(features: set[HelloFeature]) -> int:
    """The datatype bits a connection with ``features`` may be sent."""
    json = HelloFeature.Datatype in features or HelloFeature.JSON in features
    return (
        (document.JSON if json else 0)
        | (document.SNAPPY if HelloFeature.Snappy in features else 0)
        | (document.XATTR if HelloFeature.Xattr in features else 0)
    )


def _shape(conn: Connection, value: bytes, datatype: int) -> tuple[bytes, int]:
    snappy_ok = HelloFeature.Snappy in conn.features
    if not datatype & document.XATTR and snappy_ok:
        return value, datatype  # stored compressed, sent as it is
    value, datatype = document.body(value, datatype)
    if snappy_ok and conn.bucket.compression_mode is not document.CompressionMode.OFF:
        packed = snappy.deflate_if_smaller(value)
        if packed is not None:
            return packed, datatype | document.SNAPPY
    return value, datatype

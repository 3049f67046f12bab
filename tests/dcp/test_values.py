"""What a DCP consumer is sent of a stored value, by what it negotiated (the table in
:mod:`dcpkv.dcp.values`)."""

from __future__ import annotations

import pytest

from dcpkv.dcp.values import ValueShape
from dcpkv.engine import document
from dcpkv.protocol import snappy, xattr

JSON, SNAPPY, XATTR = document.JSON, document.SNAPPY, document.XATTR
BODY = b'{"text":"' + b"compressible " * 40 + b'"}'
XATTRS = {"_sync": b'{"rev":"2-b"}', "meta": b'"m"'}
WITH_X, _ = xattr.join(XATTRS, BODY)
BLOB = xattr.encode(XATTRS)
Z = snappy.deflate

PLAIN = ValueShape()
XATTRS_ON = ValueShape(xattrs=True)
SNAPPY_ON = ValueShape(snappy=True)
FORCED = ValueShape(snappy=True, force_compression=True)
NO_VALUE = ValueShape(no_value=True)
NO_VALUE_X = ValueShape(no_value=True, xattrs=True)
NO_VALUE_X_DT = ValueShape(no_value=True, xattrs=True, keep_datatype=True)


@pytest.mark.parametrize(
    ("shape", "stored", "sent"),
    [
        # plain values pass untouched unless compression is forced
        (PLAIN, (BODY, JSON), (BODY, JSON)),
        (FORCED, (BODY, JSON), (Z(BODY), JSON | SNAPPY)),
        (FORCED, (b"{}", JSON), (b"{}", JSON)),  # too small to gain
        # compressed values: as stored to Snappy consumers, inflated for the others
        (SNAPPY_ON, (Z(BODY), JSON | SNAPPY), (Z(BODY), JSON | SNAPPY)),
        (PLAIN, (Z(BODY), JSON | SNAPPY), (BODY, JSON)),
        # xattrs only with IncludeXattrs
        (PLAIN, (WITH_X, JSON | XATTR), (BODY, JSON)),
        (XATTRS_ON, (WITH_X, JSON | XATTR), (WITH_X, JSON | XATTR)),
        (XATTRS_ON, (Z(WITH_X), JSON | XATTR | SNAPPY), (WITH_X, JSON | XATTR)),
        (SNAPPY_ON, (Z(WITH_X), JSON | XATTR | SNAPPY), (Z(BODY), JSON | SNAPPY)),
        # NoValue: nothing, or just the xattrs with IncludeXattrs
        (NO_VALUE, (WITH_X, JSON | XATTR), (b"", 0)),
        (NO_VALUE_X, (WITH_X, JSON | XATTR), (BLOB, XATTR)),
        (NO_VALUE_X_DT, (Z(WITH_X), JSON | XATTR | SNAPPY), (BLOB, JSON | XATTR)),
        (NO_VALUE_X, (BODY, JSON), (b"", 0)),
    ],
)  # fmt: skip
def test_mutation_values(
    shape: ValueShape, stored: tuple[bytes, int], sent: tuple[bytes, int]
) -> None:
    assert shape.mutation(*stored) == sent


@pytest.mark.parametrize(
    ("shape", "stored", "sent"),
    [
        (PLAIN, (xattr.encode({"_sync": b"1"}), XATTR), (b"", 0)),
        (XATTRS_ON, (xattr.encode({"_sync": b"1"}), XATTR), (xattr.encode({"_sync": b"1"}), XATTR)),
        (XATTRS_ON, (b"", 0), (b"", 0)),
    ],
)  # fmt: skip
def test_deletion_values(
    shape: ValueShape, stored: tuple[bytes, int], sent: tuple[bytes, int]
) -> None:
    assert shape.deletion(*stored) == sent


def test_plain_is_the_encoders_fast_path() -> None:
    assert PLAIN.plain and SNAPPY_ON.plain and XATTRS_ON.plain
    assert not FORCED.plain and not NO_VALUE.plain

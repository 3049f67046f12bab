"""Documents with xattrs and Snappy values in the engine: what full-document writes and
deletions keep (system xattrs), the compression modes' stored forms."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dcpkv.engine import document
from dcpkv.engine.document import CompressionMode
from dcpkv.engine.item import Item
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import snappy, xattr

JSON, SNAPPY, XATTR = document.JSON, document.SNAPPY, document.XATTR
BODY = b'{"city":"' + b"Lyon" * 50 + b'"}'


def with_xattrs(body: bytes = BODY, **pairs: bytes) -> tuple[bytes, int]:
    value, _ = xattr.join(dict(pairs), body)
    return value, JSON | XATTR


def test_full_document_set_keeps_system_xattrs_and_drops_user_ones(vbucket: VBucket) -> None:
    _put(vbucket.set, with_xattrs(_sync=b'{"rev":1}', user=b'"u"'))
    item = vbucket.set(b"k", b'{"new":1}', datatype=JSON)
    doc = document.unpack(item.value or b"", item.datatype)
    assert doc.xattrs == {"_sync": b'{"rev":1}'} and doc.body == b'{"new":1}'
    assert item.datatype == JSON | XATTR


def test_a_set_bringing_its_own_xattrs_replaces_them_all(vbucket: VBucket) -> None:
    _put(vbucket.set, with_xattrs(_sync=b"1"))
    item = _put(vbucket.replace, with_xattrs(b"{}", mine=b"2"))
    assert document.unpack(item.value or b"", item.datatype).xattrs == {"mine": b"2"}


def test_a_set_over_user_xattrs_only_leaves_a_plain_value(vbucket: VBucket) -> None:
    _put(vbucket.set, with_xattrs(user=b"1"))
    item = vbucket.set(b"k", b"plain")
    assert (item.value, item.datatype) == (b"plain", 0)


@pytest.mark.parametrize("compressed", [False, True])
def test_deletion_keeps_only_system_xattrs(vbucket: VBucket, compressed: bool) -> None:
    value, dt = with_xattrs(_sync=b'{"a":1}', _txn=b"2", user=b"3")
    if compressed:
        value, dt = snappy.deflate(value), dt | SNAPPY
    vbucket.set(b"k", value, datatype=dt)
    tomb = vbucket.delete(b"k")
    assert tomb.deleted and tomb.datatype == XATTR
    assert xattr.decode(tomb.value or b"") == {"_sync": b'{"a":1}', "_txn": b"2"}


def test_deletion_of_a_plain_document_has_no_value(vbucket: VBucket) -> None:
    vbucket.set(b"k", b"v")
    tomb = vbucket.delete(b"k")
    assert (tomb.value, tomb.datatype) == (b"", 0)


def test_append_grows_the_body_behind_the_xattrs(vbucket: VBucket) -> None:
    value, dt = with_xattrs(b"ab", _s=b"1")
    vbucket.set(b"k", snappy.deflate(value), datatype=dt | SNAPPY)
    item = vbucket.append(b"k", b"cd")
    doc = document.unpack(item.value or b"", item.datatype)
    assert doc.body == b"abcd" and doc.xattrs == {"_s": b"1"}


def test_counter_over_a_compressed_number(vbucket: VBucket) -> None:
    vbucket.set(b"n", snappy.deflate(b"41" * 9), datatype=SNAPPY)
    number, _ = vbucket.incr(b"n", 1)
    assert number == int(b"41" * 9) + 1


@pytest.mark.parametrize(
    ("mode", "value", "datatype", "stored_datatype"),
    [
        (CompressionMode.OFF, snappy.deflate(BODY), JSON | SNAPPY, JSON),
        (CompressionMode.PASSIVE, snappy.deflate(BODY), JSON | SNAPPY, JSON | SNAPPY),
        (CompressionMode.PASSIVE, BODY, JSON, JSON),
        (CompressionMode.ACTIVE, BODY, JSON, JSON | SNAPPY),
        (CompressionMode.ACTIVE, b"{}", JSON, JSON),  # too small to gain
    ],
)  # fmt: skip
def test_compression_modes_stored_form(
    mode: CompressionMode, value: bytes, datatype: int, stored_datatype: int
) -> None:
    stored, dt = document.store_form(value, datatype, mode)
    assert dt == stored_datatype
    assert document.inflate(stored, dt)[0] == document.inflate(value, datatype)[0]


def _put(op: Callable[..., Item], pair: tuple[bytes, int]) -> Item:
    return op(b"k", pair[0], datatype=pair[1])


def test_a_counter_keeps_the_documents_xattrs(vbucket: VBucket) -> None:
    _put(vbucket.set, (xattr.join({"_s": b"1"}, b"41")[0], XATTR))
    number, item = vbucket.incr(b"k", 1)
    doc = document.unpack(item.value or b"", item.datatype)
    assert number == 42 and doc.body == b"42" and doc.xattrs == {"_s": b"1"}

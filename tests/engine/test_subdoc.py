"""Sub-document requests on one document: the request-level rules (module table of
:mod:`dcpkv.engine.subdoc`), xattrs, virtual xattrs, macros, deleted documents."""

from __future__ import annotations

import json

import crc32c
import pytest

from dcpkv.core.status import Status
from dcpkv.engine import document, subdoc
from dcpkv.engine.item import Item
from dcpkv.protocol import xattr
from dcpkv.protocol.constants import Opcode as O
from dcpkv.protocol.subdoc import Spec

S = Status
X, MACRO, MKDIR = subdoc.XATTR_PATH, subdoc.EXPAND_MACROS, subdoc.MKDIR_P
CAS, NEW_CAS, SEQNO = 0x1111, 0x0102030405060708, 42


def doc(body: bytes = b'{"a":1}', deleted: bool = False, **xattrs: bytes) -> Item:
    value, has = xattr.join(dict(xattrs), body)
    dt = (document.JSON if body else 0) | (document.XATTR if has else 0)
    return Item(b"k", value, 7, 0, CAS, 1, 5, dt, deleted)


def mutate(current: Item | None, *specs: Spec, flags: int = 0, cas: int = 0) -> subdoc.Mutated:
    return subdoc.mutate(current, list(specs), flags, cas, NEW_CAS, SEQNO)


def unpacked(out: subdoc.Mutated) -> tuple[dict[str, object], object]:
    d = document.unpack(out.value, out.datatype)
    return {k: json.loads(v) for k, v in d.xattrs.items()}, json.loads(d.body) if d.body else None


BODY_A6 = b'{"a":6}'
UPSERT_B = Spec(O.SubdocDictUpsert, 0, "b", b"2")


@pytest.mark.parametrize(
    ("current", "specs", "flags", "cas", "status"),
    [
        (None, [UPSERT_B], 0, 0, S.KeyEnoent),
        (doc(), [UPSERT_B], subdoc.ADD, 0, S.KeyEexists),
        (doc(), [UPSERT_B], subdoc.ADD | subdoc.MKDOC, 0, S.Einval),
        (None, [UPSERT_B], subdoc.ADD, CAS, S.Einval),
        (doc(), [UPSERT_B], 0, CAS + 1, S.KeyEexists),
        (None, [UPSERT_B], subdoc.MKDOC, CAS, S.KeyEnoent),
        (doc(deleted=True), [UPSERT_B], 0, 0, S.KeyEnoent),
        (doc(), [], 0, 0, S.SubdocInvalidCombo),
        (doc(), [UPSERT_B] * 17, 0, 0, S.SubdocInvalidCombo),
        (doc(), [Spec(O.SubdocGet, 0, "a")], 0, 0, S.SubdocInvalidCombo),
        (doc(), [UPSERT_B, Spec(O.SubdocDictUpsert, X, "x", b"1")], 0, 0,
         S.SubdocInvalidXattrOrder),
        (doc(), [Spec(O.SubdocDictUpsert, MACRO, "b", b'"${Mutation.CAS}"')], 0, 0,
         S.SubdocXattrInvalidFlagCombo),
    ],
)  # fmt: skip
def test_request_level_refusals(
    current: Item | None, specs: list[Spec], flags: int, cas: int, status: Status
) -> None:
    with pytest.raises(subdoc.SubdocError) as err:
        mutate(current, *specs, flags=flags, cas=cas)
    assert err.value.status == status


@pytest.mark.parametrize(
    ("spec", "status"),
    [
        (Spec(O.SubdocDictAdd, 0, "a", b"2"), S.SubdocPathEexists),
        (Spec(O.SubdocDictUpsert, X, "$document.x", b"1"), S.SubdocXattrCantModifyVattr),
        (Spec(O.SubdocDictUpsert, X, "-bad", b"1"), S.SubdocPathEinval),
        (Spec(O.SubdocDictUpsert, X | MACRO, "x", b'"${Mutation.nope}"'),
         S.SubdocXattrUnknownMacro),
        (Spec(O.SubdocDictUpsert, X, "x.y", b"1"), S.SubdocPathEnoent),
    ],
)  # fmt: skip
def test_the_first_failing_spec_is_reported_by_index(spec: Spec, status: Status) -> None:
    with pytest.raises(subdoc.SpecFailed) as err:
        mutate(doc(), Spec(O.SubdocDictUpsert, X, "ok", b"1"), spec)
    assert (err.value.index, err.value.status) == (1, status)


def test_body_and_xattrs_in_one_mutation_with_macros() -> None:
    out = mutate(
        doc(_sync=b'{"rev":1}', user=b'"u"'),
        Spec(O.SubdocDictUpsert, X | MKDIR | MACRO, "_sync.meta",
             b'{"cas":"${Mutation.CAS}","seq":"${Mutation.seqno}","crc":"${Mutation.value_crc32c}"}'),
        Spec(O.SubdocCounter, 0, "a", b"5"),
    )  # fmt: skip
    xattrs, body = unpacked(out)
    assert body == {"a": 6} and out.results == [(1, b"6")] and out.flags == 7
    meta = xattrs["_sync"]["meta"]  # type: ignore[index]
    assert meta["cas"] == "0x0807060504030201"  # the CAS's bytes, little-endian
    assert meta["seq"] == f"0x{SEQNO:016x}"
    assert meta["crc"] == f"0x{crc32c.crc32c(BODY_A6):08x}"
    assert xattrs["user"] == "u" and out.datatype == document.JSON | document.XATTR


def test_mkdoc_creates_an_empty_object_or_array() -> None:
    out = mutate(None, Spec(O.SubdocDictUpsert, 0, "a.b", b"1"), flags=subdoc.MKDOC)
    assert unpacked(out) == ({}, {"a": {"b": 1}}) and out.flags == 0
    out = mutate(None, Spec(O.SubdocArrayPushLast, 0, "", b"1"), flags=subdoc.ADD)
    assert unpacked(out)[1] == [1]


def test_full_document_set_keeps_every_xattr_and_delete_keeps_system_ones() -> None:
    out = mutate(doc(_s=b"1", u=b"2"), Spec(O.Set, 0, "", b'{"new":true}'))
    assert unpacked(out) == ({"_s": 1, "u": 2}, {"new": True}) and not out.deleted
    out = mutate(doc(_s=b"1", u=b"2"), Spec(O.SubdocDictUpsert, X, "_s", b"3"), Spec(O.Delete))
    assert out.deleted and unpacked(out) == ({"_s": 3}, None)


def test_xattrs_of_a_deleted_document_with_access_deleted() -> None:
    tomb = doc(b"", deleted=True, _s=b"1")
    out = mutate(tomb, Spec(O.SubdocDictUpsert, X, "_t", b"2"), flags=subdoc.ACCESS_DELETED)
    assert out.deleted and unpacked(out) == ({"_s": 1, "_t": 2}, None)
    status, results = subdoc.lookup(
        tomb, [Spec(O.SubdocGet, X, "_s"), Spec(O.SubdocGet, 0, "a")], subdoc.ACCESS_DELETED,
        lambda it: subdoc.document_vattr(it, 9),
    )  # fmt: skip
    assert status == S.SubdocMultiPathFailureDeleted
    assert [(r.status, r.value) for r in results] == [(S.Success, b"1"), (S.SubdocPathEnoent, b"")]


def test_lookups_and_virtual_xattrs() -> None:
    item = doc(b'{"a":[1,2]}', _s=b'{"k":"v"}')
    specs = [
        Spec(O.SubdocGet, X, "_s.k"), Spec(O.SubdocGet, X, "$document.revid"),
        Spec(O.SubdocGet, X, "$nope"), Spec(O.SubdocGet, X, "$XTOC"),
        Spec(O.SubdocExists, 0, "a[1]"), Spec(O.SubdocGetCount, 0, "a"), Spec(O.Get),
        Spec(O.SubdocGet, 0, "b"),
    ]  # fmt: skip
    status, results = subdoc.lookup(item, specs, 0, lambda it: subdoc.document_vattr(it, 9))
    assert status == S.SubdocMultiPathFailure
    assert [(r.status, r.value) for r in results] == [
        (S.Success, b'"v"'), (S.Success, b'"1"'), (S.SubdocXattrUnknownVattr, b""),
        (S.Success, b'["_s"]'), (S.Success, b""), (S.Success, b"2"),
        (S.Success, b'{"a":[1,2]}'), (S.SubdocPathEnoent, b""),
    ]  # fmt: skip


def test_a_body_that_is_not_json() -> None:
    item = Item(b"k", b"plain text", 0, 0, CAS, 1, 5, 0)
    _, results = subdoc.lookup(item, [Spec(O.SubdocGet, 0, "a"), Spec(O.Get)], 0, lambda it: {})
    assert [r.status for r in results] == [S.SubdocDocNotJson, S.Success]
    with pytest.raises(subdoc.SpecFailed) as err:
        mutate(item, Spec(O.SubdocDictUpsert, 0, "a", b"1"))
    assert err.value.status == S.SubdocDocNotJson

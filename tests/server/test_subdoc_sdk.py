"""Sub-document operations, xattrs, macros and compression with the official Couchbase SDK
(PyPI ``couchbase``) against a real server, and what a DCP consumer sees of them: one change
per ``mutate_in``."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import couchbase.subdocument as SD
import pytest
from couchbase.collection import Collection
from couchbase.exceptions import (
    CasMismatchException,
    DocumentExistsException,
    DocumentNotFoundException,
    PathExistsException,
    PathMismatchException,
    PathNotFoundException,
)
from couchbase.options import MutateInOptions

from dcpkv.client import events
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.client.sync import SyncConsumer
from dcpkv.core.vbucket import vbucket_for_key
from support.rawclient import DCP_MUTATION, F_DATATYPE, F_XATTR, RawClient, split_xattrs
from support.sdk_cluster import module_server, sdk_collection
from support.serverproc import ServerProcess

VBUCKETS = 16
INCLUDE_XATTRS = 0x04


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with module_server(tmp_path_factory.mktemp("subdoc")) as srv:
        yield srv


@pytest.fixture(scope="module")
def coll(server: ServerProcess) -> Iterator[Collection]:
    with sdk_collection(server.port) as collection:
        yield collection


def test_lookup_in_get_exists_count(coll: Collection) -> None:
    coll.upsert("lk", {"name": "x", "tags": ["a", "b", "c"], "nested": {"n": 1}})
    res = coll.lookup_in(
        "lk", [SD.get("name"), SD.exists("nested.n"), SD.exists("nope"), SD.count("tags"),
               SD.get("tags[-1]")],
    )  # fmt: skip
    assert res.content_as[str](0) == "x"
    assert res.exists(1) and not res.exists(2)
    assert res.content_as[int](3) == 3
    assert res.content_as[str](4) == "c"
    with pytest.raises(DocumentNotFoundException):
        coll.lookup_in("missing-doc", [SD.get("a")])


def test_mutate_in_body_operations_are_one_atomic_change(coll: Collection) -> None:
    coll.upsert("mu", {"a": 1, "arr": [2], "gone": True})
    before = coll.get("mu").cas
    res = coll.mutate_in(
        "mu",
        [SD.upsert("b.c", "deep", create_parents=True), SD.insert("d", 4), SD.remove("gone"),
         SD.replace("a", 10), SD.array_append("arr", 3, 4), SD.array_prepend("arr", 1),
         SD.array_insert("arr[1]", 1.5), SD.array_addunique("arr", 5), SD.increment("n", 7)],
    )  # fmt: skip
    assert res.cas != before
    assert coll.get("mu").content_as[dict] == {
        "a": 10, "arr": [1, 1.5, 2, 3, 4, 5], "b": {"c": "deep"}, "d": 4, "n": 7,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (SD.insert("a", 2), PathExistsException),
        (SD.replace("nope", 1), PathNotFoundException),
        (SD.upsert("a.b", 1), PathMismatchException),
        (SD.array_addunique("arr", 1), PathExistsException),
    ],
)  # fmt: skip
def test_a_failing_path_stores_nothing(coll: Collection, spec: SD.Spec, error: type) -> None:
    coll.upsert("fail", {"a": 1, "arr": [1]})
    cas = coll.get("fail").cas
    with pytest.raises(error):
        coll.mutate_in("fail", [SD.upsert("z", 1), spec])
    got = coll.get("fail")
    assert got.cas == cas and got.content_as[dict] == {"a": 1, "arr": [1]}


def test_store_semantics_and_cas(coll: Collection) -> None:
    with pytest.raises(DocumentNotFoundException):
        coll.mutate_in("sem", [SD.upsert("a", 1)])
    coll.mutate_in(
        "sem", [SD.upsert("a", 1)], MutateInOptions(store_semantics=SD.StoreSemantics.UPSERT)
    )
    with pytest.raises(DocumentExistsException):
        coll.mutate_in(
            "sem", [SD.upsert("a", 2)], MutateInOptions(store_semantics=SD.StoreSemantics.INSERT)
        )
    stale = coll.get("sem").cas
    coll.mutate_in("sem", [SD.upsert("a", 3)], MutateInOptions(cas=stale))
    with pytest.raises(CasMismatchException):
        coll.mutate_in("sem", [SD.upsert("a", 4)], MutateInOptions(cas=stale))
    assert coll.get("sem").content_as[dict] == {"a": 3}


def test_xattrs_and_macros(coll: Collection) -> None:
    coll.upsert("xa", {"body": 1})
    res = coll.mutate_in(
        "xa",
        [SD.upsert("_sync.rev", "1-a", xattr=True, create_parents=True),
         SD.upsert("_sync.cas", SD.MutationMacro.cas(), xattr=True),
         SD.upsert("_sync.seq", SD.MutationMacro.seq_no(), xattr=True),
         SD.upsert("_sync.crc", SD.MutationMacro.value_crc32c(), xattr=True),
         SD.upsert("meta", {"by": "me"}, xattr=True),
         SD.upsert("body", 2)],
    )  # fmt: skip
    got = coll.lookup_in(
        "xa", [SD.get("_sync", xattr=True), SD.get("meta.by", xattr=True), SD.get("body"),
               SD.get("$document.CAS", xattr=True)],
    )  # fmt: skip
    sync = got.content_as[dict](0)
    assert sync["rev"] == "1-a" and SD.convert_macro_cas_to_cas(sync["cas"]) == res.cas
    assert int(sync["seq"], 16) == res.mutation_token().sequence_number
    assert got.content_as[str](1) == "me" and got.content_as[int](2) == 2
    assert got.content_as[str](3) == sync["cas"]
    assert sync["crc"].startswith("0x") and len(sync["crc"]) == 10
    # a plain get sees the body only; a full-document upsert keeps the system xattr only
    assert coll.get("xa").content_as[dict] == {"body": 2}
    coll.upsert("xa", {"body": 3})
    after = coll.lookup_in("xa", [SD.get("_sync.rev", xattr=True), SD.exists("meta", xattr=True)])
    assert after.content_as[str](0) == "1-a" and not after.exists(1)


@pytest.mark.parametrize("size", [10, 1_000, 100_000, 2_000_000])
def test_values_of_several_sizes_round_trip(coll: Collection, size: int) -> None:
    doc = {"text": "compress me " * (size // 12), "n": size}
    coll.upsert(f"size-{size}", doc)  # the SDK compresses the larger ones (Snappy negotiated)
    assert coll.get(f"size-{size}").content_as[dict] == doc
    res = coll.lookup_in(f"size-{size}", [SD.get("n")])
    assert res.content_as[int](0) == size


def test_dcp_sees_one_change_per_mutate_in_with_xattrs(
    coll: Collection, server: ServerProcess
) -> None:
    coll.upsert("dcp-one", {"v": 0})
    coll.mutate_in("dcp-one", [SD.upsert("x", 1, xattr=True), SD.upsert("v", 1),
                               SD.increment("c", 1)])  # fmt: skip
    vb = vbucket_for_key(b"dcp-one", VBUCKETS)
    c = RawClient(server.port)
    c.hello(F_DATATYPE, F_XATTR)
    c.login()
    c.dcp_open("subdoc-dcp", INCLUDE_XATTRS)
    high = c.high_seqno(vb)
    assert c.stream_request(vb, end=high).status == 0
    changes = [p for p in c.stream_until_end() if p.opcode == DCP_MUTATION and p.key == b"dcp-one"]
    assert len(changes) == 1  # the upsert deduplicated away, the mutate_in as one mutation
    xattrs, body = split_xattrs(changes[0].value)
    assert xattrs == {"x": "1"} and body == b'{"v":1,"c":1}'


def test_raw_counter_statuses(server: ServerProcess) -> None:
    """Statuses the SDK turns into exceptions, checked on the wire: a bad delta is 0xc8."""
    c = RawClient(server.port)
    c.hello(F_DATATYPE)
    c.login()
    key, vb = b"ctr", vbucket_for_key(b"ctr", VBUCKETS)
    c.call(0x01, key, b'{"n":1}', struct.pack(">II", 0, 0), vbucket=vb, datatype=1)
    path = b"n"
    answer = c.call(0xCF, key, path + b"0", struct.pack(">HB", len(path), 0), vbucket=vb)
    assert answer.status == 0xC8
    answer = c.call(0xCF, key, path + b"5", struct.pack(">HB", len(path), 0), vbucket=vb)
    assert (answer.status, answer.value) == (0, b"6")


@pytest.mark.parametrize("sdk_compression", [True, False])
@pytest.mark.parametrize("mode", ["off", "active"])
def test_compression_on_and_off(
    server_factory: type[ServerProcess], tmp_path: Path, mode: str, sdk_compression: bool
) -> None:
    """Whatever each side does about Snappy, documents, sub-document reads and DCP agree."""
    srv = server_factory(tmp_path / "d", tmp_path / "log", "--compression-mode", mode)
    srv.start()
    docs = {
        f"c{size}": {"text": "snappy " * (size // 7), "n": size} for size in (50, 5_000, 300_000)
    }
    with sdk_collection(srv.port, enable_compression=sdk_compression) as collection:
        for key, doc in docs.items():
            collection.upsert(key, doc)
            collection.mutate_in(key, [SD.upsert("m", 1, xattr=True), SD.increment("n", 1)])
        for key, doc in docs.items():
            assert collection.get(key).content_as[dict] == {**doc, "n": doc["n"] + 1}
            got = collection.lookup_in(key, [SD.get("m", xattr=True), SD.get("text")])
            assert got.content_as[int](0) == 1 and got.content_as[str](1) == doc["text"]
    with SyncConsumer(
        ClientSettings(ConnectionSettings.at(port=srv.port), name="z", noop_interval=1.0)
    ) as sync:
        seen = {
            ev.key: ev.value for ev in sync.stream(end="now") if isinstance(ev, events.Mutation)
        }
    for key, doc in docs.items():
        assert json.loads(seen[key.encode()]) == {**doc, "n": doc["n"] + 1}

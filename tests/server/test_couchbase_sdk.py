"""The official Couchbase SDK (PyPI ``couchbase``) against a real server subprocess.

One server and one cluster connection for the whole module (connecting is the slow part), with
the SDK's default authentication: SCRAM-SHA512, whose client nonce contains spaces (see
:mod:`dcpkv.server.scram`). Every test uses its own keys, so their order does not matter.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import couchbase.subdocument as SD
import pytest
from couchbase.collection import Collection
from couchbase.durability import DurabilityLevel, ServerDurability
from couchbase.exceptions import (
    CasMismatchException,
    DocumentExistsException,
    DocumentNotFoundException,
    DurabilityImpossibleException,
)
from couchbase.options import (
    AppendOptions,
    DecrementOptions,
    DeltaValue,
    GetOptions,
    IncrementOptions,
    InsertOptions,
    MutateInOptions,
    PrependOptions,
    RemoveOptions,
    ReplaceOptions,
    SignedInt64,
    UpsertOptions,
)
from couchbase.transcoder import RawBinaryTranscoder

from dcpkv.core.vbucket import vbucket_for_key
from support.kvclient import KVClient, poll_rounds
from support.sdk_cluster import module_server, sdk_collection
from support.serverproc import ServerProcess
from support.topology import alone, set_topologies

VBUCKETS = 16  # what ServerProcess starts the server with
RAW = RawBinaryTranscoder()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with module_server(tmp_path_factory.mktemp("sdk")) as srv:
        yield srv


@pytest.fixture(scope="module")
def coll(server: ServerProcess) -> Iterator[Collection]:
    with sdk_collection(server.port) as collection:
        yield collection


def test_upsert_get_remove(coll: Collection) -> None:
    coll.upsert("doc1", {"a": 1})
    assert coll.get("doc1").content_as[dict] == {"a": 1}
    coll.remove("doc1")
    with pytest.raises(DocumentNotFoundException):
        coll.get("doc1")
    with pytest.raises(DocumentNotFoundException):
        coll.remove("doc1")


def test_replace_with_current_and_stale_cas(coll: Collection) -> None:
    coll.upsert("cas-doc", {"v": 1})
    current = coll.get("cas-doc").cas
    replaced = coll.replace("cas-doc", {"v": 2}, ReplaceOptions(cas=current))
    assert replaced.cas != current
    with pytest.raises(CasMismatchException):
        coll.replace("cas-doc", {"v": 3}, ReplaceOptions(cas=current))
    assert coll.get("cas-doc").content_as[dict] == {"v": 2}


def test_insert_of_an_existing_key_fails(coll: Collection) -> None:
    coll.insert("ins-doc", {"first": True})
    with pytest.raises(DocumentExistsException):
        coll.insert("ins-doc", {"first": False})
    assert coll.get("ins-doc").content_as[dict] == {"first": True}


def test_touch_sets_an_expiry_and_get_and_touch_reads(coll: Collection) -> None:
    coll.upsert("ttl-doc", {"t": 1})
    got = coll.get_and_touch("ttl-doc", timedelta(hours=1))
    assert got.content_as[dict] == {"t": 1}
    coll.touch("ttl-doc", timedelta(seconds=1))
    for _ in poll_rounds(limit_s=30, pause_s=0.1):
        try:
            coll.get("ttl-doc")
        except DocumentNotFoundException:
            return
    raise AssertionError("the touched document never expired")


def test_counter(coll: Collection) -> None:
    counter = coll.binary()
    first = IncrementOptions(initial=SignedInt64(10), delta=DeltaValue(5))
    assert counter.increment("ctr", first).content == 10
    assert counter.increment("ctr", IncrementOptions(delta=DeltaValue(5))).content == 15
    assert counter.decrement("ctr", DecrementOptions(delta=DeltaValue(20))).content == 0


def test_mutation_token_names_the_vbucket_uuid_and_seqno(
    coll: Collection, server: ServerProcess
) -> None:
    vb = vbucket_for_key(b"tok-doc", VBUCKETS)
    with KVClient(server.port) as raw:
        raw.login()
        before = raw.stats(b"vbucket-seqno %d" % vb)
        token = coll.upsert("tok-doc", {"x": 1}).mutation_token()
        after = raw.stats(b"vbucket-seqno %d" % vb)
    assert token is not None
    assert token.partition_id == vb
    assert token.partition_uuid == int(after[f"vb_{vb}:uuid"]) == int(before[f"vb_{vb}:uuid"])
    assert token.sequence_number == int(after[f"vb_{vb}:high_seqno"])
    assert token.sequence_number == int(before[f"vb_{vb}:high_seqno"]) + 1
    assert token.bucket_name == "default"


def test_default_scram_auth_was_never_refused(server: ServerProcess, coll: Collection) -> None:
    # Without TLS the SDK offers only SCRAM; the server logs every refused exchange.
    coll.upsert("auth-doc", "x")
    assert "auth failed" not in server.log()


# Each SDK call with a durability requirement, on a document "d" holding {"v": 0}.
DURABLE_CALLS = {
    "upsert": lambda c, d, o: c.upsert(d, {"v": 1}, UpsertOptions(durability=o)),
    "insert": lambda c, d, o: c.insert(d + "-new", {"v": 1}, InsertOptions(durability=o)),
    "replace": lambda c, d, o: c.replace(d, {"v": 1}, ReplaceOptions(durability=o)),
    "remove": lambda c, d, o: c.remove(d, RemoveOptions(durability=o)),
    "mutate_in": lambda c, d, o: c.mutate_in(d, [SD.upsert("v", 1)], MutateInOptions(durability=o)),
    "increment": lambda c, d, o: c.binary().increment(
        d + "-ctr", IncrementOptions(initial=SignedInt64(1), durability=o)
    ),
    "decrement": lambda c, d, o: c.binary().decrement(
        d + "-ctr", DecrementOptions(initial=SignedInt64(1), durability=o)
    ),
    "append": lambda c, d, o: c.binary().append(d + "-raw", b"+", AppendOptions(durability=o)),
    "prepend": lambda c, d, o: c.binary().prepend(d + "-raw", b"+", PrependOptions(durability=o)),
}
# What the document holds once each call committed: (key suffix, how to read, expected).
COMMITTED = {
    "upsert": ("", "json", {"v": 1}),
    "insert": ("-new", "json", {"v": 1}),
    "replace": ("", "json", {"v": 1}),
    "remove": ("", "exists", False),
    "mutate_in": ("", "json", {"v": 1}),
    "increment": ("-ctr", "int", 1),
    "decrement": ("-ctr", "int", 1),
    "append": ("-raw", "raw", b"r+"),
    "prepend": ("-raw", "raw", b"+r"),
}


@pytest.mark.parametrize("call", sorted(DURABLE_CALLS))
@pytest.mark.parametrize("level", list(DurabilityLevel)[1:])  # every level but NONE
def test_server_durability_is_refused_not_faked(
    coll: Collection, call: str, level: DurabilityLevel
) -> None:
    """A lone node whose vbuckets have no replication topology (no cluster manager) cannot
    meet any level, as the reference's single node with no replica: the SDK's
    ServerDurability fails with DurabilityImpossible, never succeeds from memory, and the
    document is unchanged (issue 28, item 0)."""
    doc = f"durable-{call}-{int(level)}"
    coll.upsert(doc, {"v": 0})
    coll.upsert(doc + "-raw", b"r", UpsertOptions(transcoder=RAW))
    with pytest.raises(DurabilityImpossibleException):
        DURABLE_CALLS[call](coll, doc, ServerDurability(level))
    assert coll.get(doc).content_as[dict] == {"v": 0}
    assert not coll.exists(doc + "-new").exists
    assert not coll.exists(doc + "-ctr").exists
    assert coll.get(doc + "-raw", GetOptions(transcoder=RAW)).content_as[bytes] == b"r"


@pytest.fixture(scope="module")
def topo_coll(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collection]:
    """A node whose every vbucket has the single-node topology (a majority of one), as a
    cluster manager would set on a one-node cluster with no replica."""
    with module_server(tmp_path_factory.mktemp("sdk-topology")) as srv:
        set_topologies(srv.port, alone(srv.port))
        with sdk_collection(srv.port) as collection:
            yield collection


@pytest.mark.parametrize("call", sorted(DURABLE_CALLS))
@pytest.mark.parametrize("level", list(DurabilityLevel)[1:])  # every level but NONE
def test_server_durability_commits_on_a_single_node_topology(
    topo_coll: Collection, call: str, level: DurabilityLevel
) -> None:
    doc = f"committed-{call}-{int(level)}"
    topo_coll.upsert(doc, {"v": 0})
    topo_coll.upsert(doc + "-raw", b"r", UpsertOptions(transcoder=RAW))
    result = DURABLE_CALLS[call](topo_coll, doc, ServerDurability(level))
    suffix, how, expected = COMMITTED[call]
    if how == "exists":
        assert topo_coll.exists(doc + suffix).exists is expected
        return
    if how == "int":
        got = topo_coll.get(doc + suffix)
        assert got.content_as[int] == expected
    elif how == "json":
        got = topo_coll.get(doc + suffix)
        assert got.content_as[dict] == expected
    else:
        got = topo_coll.get(doc + suffix, GetOptions(transcoder=RAW))
        assert got.content_as[bytes] == expected
    assert got.cas == result.cas  # the answer came with the commit's CAS

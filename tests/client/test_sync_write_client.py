"""The client library's durable writes (client/durability.py, ClusterKV's writes): the
requirement on the wire, each SyncWrite status as its own exception, and every write with a
durability level against a real node whose vbuckets have a single-node topology."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from dcpkv.client.cluster import ClusterKV
from dcpkv.client.connection import ClientError
from dcpkv.client.durability import (
    Durability,
    DurabilityInvalidLevelError,
    ServerDurability,
    SyncWriteAmbiguousError,
    SyncWriteImpossibleError,
    SyncWriteInProgressError,
    SyncWriteReCommitInProgressError,
    framing,
    parse_durability,
    sync_write_error,
)
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.core.durability import DurabilityImpossibleError
from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status
from dcpkv.protocol.constants import Opcode
from dcpkv.protocol.subdoc import Spec
from support.serverproc import ServerProcess
from support.topology import alone, key_in, set_topologies

DURABLE_VBS = range(0, 14)
WAITING_VB, BARE_VB = 14, 15  # a chain with an absent replica; no topology at all
LEVELS = [
    Durability.MAJORITY,
    Durability.MAJORITY_AND_PERSIST_TO_ACTIVE,
    Durability.PERSIST_TO_MAJORITY,
]


@pytest.mark.parametrize(
    ("option", "wire"),
    [
        (None, ""),
        (Durability.NONE, ""),
        (Durability.MAJORITY, "1101"),
        (ServerDurability(Durability.MAJORITY, 5.0), "13011388"),  # the spec's example
        (ServerDurability(Durability.PERSIST_TO_MAJORITY, 0.25), "130300fa"),
        (Durability.MAJORITY_AND_PERSIST_TO_ACTIVE, "1102"),
    ],
)
def test_the_requirement_on_the_wire(option: object, wire: str) -> None:
    assert framing(option).hex() == wire  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("none", Durability.NONE),
        ("majority", Durability.MAJORITY),
        ("majorityAndPersistActive", Durability.MAJORITY_AND_PERSIST_TO_ACTIVE),
        ("PERSIST_TO_MAJORITY", Durability.PERSIST_TO_MAJORITY),
        ("persistToMajority", Durability.PERSIST_TO_MAJORITY),
    ],
)
def test_level_names(text: str, level: Durability) -> None:
    assert parse_durability(text) is level


def test_bad_level_names_and_timeouts_are_refused() -> None:
    with pytest.raises(ValueError, match="majority"):
        parse_durability("all")
    for timeout in (0.0, 66.0):
        with pytest.raises(ValueError, match="timeout"):
            ServerDurability(Durability.MAJORITY, timeout)


@pytest.mark.parametrize(
    ("status", "error", "retry"),
    [
        (Status.DurabilityInvalidLevel, DurabilityInvalidLevelError, "never"),
        (Status.DurabilityImpossible, SyncWriteImpossibleError, "never"),
        (Status.SyncWriteInProgress, SyncWriteInProgressError, "later"),
        (Status.SyncWriteAmbiguous, SyncWriteAmbiguousError, "after-read"),
        (Status.SyncWriteReCommitInProgress, SyncWriteReCommitInProgressError, "later"),
    ],
)
def test_each_status_is_its_own_error(status: Status, error: type, retry: str) -> None:
    exc = sync_write_error(status, "Set")
    assert type(exc) is error and isinstance(exc, DcpkvError)
    assert (exc.status, exc.retry, exc.retry_later) == (status, retry, retry == "later")
    assert sync_write_error(Status.KeyEnoent, "Set") is None


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("syncclient")
    srv = ServerProcess(root / "data", root / "server.log")
    srv.start()
    try:
        chains = alone(srv.port, DURABLE_VBS)
        chains[WAITING_VB] = [f"127.0.0.1:{srv.port}", "replica1"]
        set_topologies(srv.port, chains)
        yield srv
    finally:
        srv.reap()


def run(node: ServerProcess, scenario) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        config = ClientSettings(ConnectionSettings.at(port=node.port), retry_timeout=5.0)
        async with await ClusterKV.open(config) as kv:
            await scenario(kv)

    asyncio.run(go())


@pytest.mark.parametrize("level", LEVELS)
def test_every_write_with_a_level_commits(node: ServerProcess, level: Durability) -> None:
    key = key_in(3, f"doc-{int(level)}")
    counter = key_in(4, f"n-{int(level)}")
    durable = ServerDurability(level, 10.0)

    async def scenario(kv: ClusterKV) -> None:
        await kv.insert(key, b'{"a":1}', durability=level)
        await kv.replace(key, b'{"a":2}', durability=durable)
        await kv.append(key, b" ", durability=durable)
        await kv.prepend(key, b" ", durability=durable)
        token = await kv.mutate_in(
            key, [Spec(Opcode.SubdocDictUpsert, 0, "b", b"3")], durability=durable
        )
        doc = await kv.get(token.vbucket, key)
        assert doc is not None and doc.value == b'{"a":2,"b":3}'
        high = (await kv.vbucket_seqnos(token.vbucket))[token.vbucket][1]
        assert token.seqno == high  # the commit's seqno
        value, token = await kv.incr(counter, 5, initial=10, durability=durable)
        assert value == 10
        value, token = await kv.decr(counter, 3, durability=durable)
        assert value == 7
        doc = await kv.get(token.vbucket, counter)
        assert doc is not None and doc.value == b"7"
        await kv.upsert(key, b"v", durability=durable)
        await kv.remove(key, durability=durable)
        assert await kv.get(token.vbucket, key) is None

    run(node, scenario)


def test_refusals_are_their_own_errors(node: ServerProcess) -> None:
    waiting, bare = key_in(WAITING_VB, "waiting"), key_in(BARE_VB, "bare")

    async def scenario(kv: ClusterKV) -> None:
        # Answers keep the request order on a connection: the other writes go on another.
        config = ClientSettings(ConnectionSettings.at(port=node.port), retry_timeout=5.0)
        async with await ClusterKV.open(config) as other:
            await two_clients(kv, other)

    async def two_clients(kv: ClusterKV, other: ClusterKV) -> None:
        await kv.upsert(waiting, b"old")
        first = asyncio.ensure_future(
            kv.upsert(waiting, b"new", durability=ServerDurability(Durability.MAJORITY, 1.5))
        )
        # A Replace with a wrong CAS changes nothing: KeyExists until the prepare is there,
        # then SyncWriteInProgress (its check comes first), as any write of the key.
        status = Status.KeyEexists
        while status == Status.KeyEexists:
            try:
                await other.replace(waiting, b"x", cas=1)
            except ClientError as exc:
                status = exc.status  # type: ignore[assignment]
            except SyncWriteInProgressError as exc:
                assert exc.retry_later
                status = exc.status  # type: ignore[assignment]
        assert status == Status.SyncWriteInProgress
        with pytest.raises(SyncWriteInProgressError):
            await other.upsert(waiting, b"other", durability=Durability.MAJORITY)
        with pytest.raises(SyncWriteAmbiguousError) as ambiguous:
            await first
        assert ambiguous.value.retry == "after-read"
        doc = await kv.get(kv.vbucket_of(waiting), waiting)
        assert doc is not None and doc.value == b"old"  # aborted: nothing committed
        with pytest.raises(SyncWriteImpossibleError) as impossible:
            await kv.upsert(bare, b"v", durability=Durability.MAJORITY)
        assert isinstance(impossible.value, DurabilityImpossibleError)
        assert await kv.get(kv.vbucket_of(bare), bare) is None

    run(node, scenario)

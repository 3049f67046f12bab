"""SeqnoPersistence (0xb7): the decision table (server/seqno_persistence.py), then a real
single node answering it through the client library, parked until the flusher catches up."""

from __future__ import annotations

import asyncio

import pytest

from dcpkv.client.cluster import ClusterKV
from dcpkv.client.connection import ClientError
from dcpkv.client.settings import ClientSettings, ConnectionSettings, Node
from dcpkv.core.durability import DurabilityLostError, MutationToken
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol import kv
from dcpkv.protocol.constants import HelloFeature
from dcpkv.server.seqno_persistence import WAIT, outcome
from support.serverproc import ServerProcess

# newest first: branch 30 began at seqno 8, on branch 20 (which began at 0)
LOG = (FailoverEntry(30, 8), FailoverEntry(20, 0))
ACTIVE, REPLICA, DEAD = VBucketState.ACTIVE, VBucketState.REPLICA, VBucketState.DEAD


@pytest.mark.parametrize(
    ("state", "persisted", "seqno", "uuid", "expected"),
    [
        (ACTIVE, 10, 10, 0, Status.Success),  # persisted through it, uuid unchecked
        (ACTIVE, 9, 10, 0, WAIT),
        (REPLICA, 12, 10, 30, Status.Success),  # a replica answers too
        (ACTIVE, 12, 7, 20, Status.Success),  # old branch, below where it ended: still here
        (ACTIVE, 12, 8, 20, Status.Success),
        (ACTIVE, 12, 9, 20, Status.KeyEnoent),  # old branch above its end: not this history
        (ACTIVE, 12, 5, 99, Status.KeyEnoent),  # a uuid the log never held
        (ACTIVE, 5, 9, 20, Status.KeyEnoent),  # lost whatever is persisted
        (DEAD, 12, 1, 0, Status.NotMyVbucket),
        (None, 12, 1, 0, Status.NotMyVbucket),
    ],
)
def test_seqno_persistence_decisions(
    state: VBucketState | None, persisted: int, seqno: int, uuid: int, expected: Status | None
) -> None:
    assert outcome(state, LOG, persisted, seqno, uuid) is expected


def test_a_node_answers_seqno_persistence_once_it_persisted_the_write(
    server: ServerProcess,
) -> None:
    config = ClientSettings(ConnectionSettings.at(port=server.port), retry_timeout=5.0)
    node = Node("127.0.0.1", server.port)

    async def scenario() -> None:
        kv_client = await ClusterKV.open(config)
        try:
            # a single plain node: the map names it active for every vbucket
            assert kv_client.router.active(3) == node
            # callers at the same time share one session (and one connection)
            await kv_client.drop(node)
            sessions = await asyncio.gather(*(kv_client.session(node) for _ in range(20)))
            assert all(s is sessions[0] for s in sessions)
            tokens = [await kv_client.upsert(f"p{i}".encode(), b"v" * 100) for i in range(50)]
            # every request parks until the flusher ran; all are answered, none lost
            await asyncio.gather(*(kv_client.wait_persisted(node, t, timeout=10) for t in tokens))
            t = tokens[-1]
            with pytest.raises(DurabilityLostError):  # a branch this vbucket never had
                await kv_client.wait_persisted(node, MutationToken(t.vbucket, 12345, t.seqno))
            session = await kv_client.session(node)
            nowhere = await session.conn.call(kv.SeqnoPersistence(vbucket=999, seqno=1))
            assert nowhere.status == Status.NotMyVbucket
            # synchronous replication is acknowledged (SyncWrites need a vbucket topology)
            hello = await session.conn.call(
                kv.Hello(features=(HelloFeature.SyncReplication, HelloFeature.MutationSeqno))
            )
            assert isinstance(hello, kv.HelloResponse)
            assert set(hello.features) == {
                HelloFeature.SyncReplication,
                HelloFeature.MutationSeqno,
            }
        finally:
            await kv_client.close()

    asyncio.run(scenario())


def test_durability_beyond_a_single_node_is_refused_at_once(server: ServerProcess) -> None:
    config = ClientSettings(ConnectionSettings.at(port=server.port))

    async def scenario() -> None:
        kv_client = await ClusterKV.open(config)
        try:
            with pytest.raises(ValueError, match="replica"):
                await kv_client.upsert(b"k", b"v", replicate_to=1)
            assert await kv_client.get(kv_client.vbucket_of(b"k"), b"k") is None  # not written
            await kv_client.upsert(b"k", b"v", persist_to=1)  # the one node persists it
            with pytest.raises(ClientError):
                await ClusterKV.open(
                    ClientSettings(ConnectionSettings.at(port=server.port, password="wrong"))
                )
        finally:
            await kv_client.close()

    asyncio.run(scenario())

"""The client library against a real cluster (managed nodes and ``dcpkv manager`` as
processes on free ports): connection strings naming dead nodes, routing by the map, the DCP
consumer through a kill -9 and a failover, client durability through a failover that lost a
write. Waits are bounded polling loops; nothing asserts on time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dcpkv.client import events
from dcpkv.client.blocking import BlockingKV
from dcpkv.client.cluster import ClusterKV
from dcpkv.client.consumer import Consumer
from dcpkv.client.mutation_log import MutationLog
from dcpkv.client.settings import ClientSettings, ConnectionSettings, Node
from dcpkv.client.writer import KVWriter, WriteOp
from dcpkv.core.durability import DurabilityLostError, DurabilityTimeoutError
from dcpkv.core.vbucket import vbucket_for_key
from support.managerproc import VBUCKETS, Cluster, ManagerProcess, start_cluster
from support.serverproc import ServerProcess


def settings_of(*nodes: str) -> ClientSettings:
    return ClientSettings(
        ConnectionSettings.parse("couchbase://" + ",".join(nodes)),
        name="dcpkv-test",
        noop_interval=1.0,
        max_backoff=0.5,
        connect_timeout=2.0,
        retry_timeout=60.0,
    )


def dead_address() -> str:
    """A local port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@contextlib.asynccontextmanager
async def cluster_kv(config: ClientSettings) -> AsyncIterator[ClusterKV]:
    kv = await ClusterKV.open(config)
    try:
        await wait_map_complete(kv)
        yield kv
    finally:
        await kv.close()


async def wait_map_complete(kv: ClusterKV) -> None:
    """Until the map gives every vbucket an active (the manager pushes it after start)."""
    for _ in range(400):
        m = kv.router.map
        if m is not None and all(m.active(vb) for vb in range(VBUCKETS)):
            return
        await asyncio.sleep(0.05)
        await kv.refresh()
    raise AssertionError(f"the map never named an active for every vbucket: {kv.router.map}")


def failover(cluster: Cluster, node: ServerProcess) -> None:
    cli = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "cluster", "failover", cluster.name(node),
         "--url", cluster.manager.url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr


def key_in(vb: int, prefix: str) -> bytes:
    return next(
        k for i in range(100_000) if vbucket_for_key(k := f"{prefix}{i}".encode(), VBUCKETS) == vb
    )


def active_items(node: ServerProcess) -> int:
    with BlockingKV.connect(ConnectionSettings.at(port=node.port)) as session:
        return int(dict(session.stats(""))["curr_items"])


# -- connection strings -----------------------------------------------------------------------


def test_a_connection_string_naming_a_dead_node_and_a_live_one_reaches_every_node(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    live = cluster.name(cluster.nodes[1])
    config = settings_of(dead_address(), live)

    async def scenario() -> dict[bytes, bytes | None]:
        async with cluster_kv(config) as kv:
            for i in range(64):
                await kv.upsert(f"k{i}".encode(), f"v{i}".encode())
            assert kv.counters["not_my_vbucket"] == 0  # every write went to its active
            assert set(kv._sessions) == {Node("127.0.0.1", n.port) for n in cluster.nodes}
            got: dict[bytes, bytes | None] = {}
            for i in range(64):
                key = f"k{i}".encode()
                doc = await kv.get(vbucket_for_key(key, VBUCKETS), key)
                got[key] = None if doc is None else doc.value
            return got

    got = asyncio.run(scenario())
    assert got == {f"k{i}".encode(): f"v{i}".encode() for i in range(64)}
    # the blocking bulk writer (loader, Spark sink) splits its windows by node
    with KVWriter(config.connection, VBUCKETS) as writer:
        assert writer.write(WriteOp(f"k{i}".encode(), value=b"w") for i in range(64)) == 64
        assert set(writer.sessions) == {Node("127.0.0.1", n.port) for n in cluster.nodes}
    assert sum(active_items(n) for n in cluster.nodes) == 64
    # the commands take the same connection string: every vbucket streamed from its active
    every = ",".join(cluster.name(n) for n in cluster.nodes)
    for cmd in (["stream", "--to", "now"], ["failover-log", "0", "15", "--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "dcpkv.cli.main", *cmd, "--host",
             f"couchbase://{dead_address()},{every}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        if cmd[0] == "stream":
            lines = [json.loads(line) for line in done.stdout.splitlines()]
            assert {d["key"] for d in lines if d["op"] == "mutation"} == {
                f"k{i}" for i in range(64)
            }
        else:
            assert set(json.loads(done.stdout)) == {"0", "15"}
    with BlockingKV.connect(config.connection) as session:  # skips the dead seed
        assert dict(session.stats(""))["curr_items"].isdigit()
    stats = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "stats",
         "--host", f"couchbase://{dead_address()},{live}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    assert "curr_items" in stats.stdout


# -- the DCP consumer through a kill -9 and a failover ----------------------------------------


def test_the_consumer_follows_the_bucket_through_a_kill9_and_a_failover(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    victim = cluster.nodes[0]
    config = settings_of(*(cluster.name(n) for n in cluster.nodes))

    async def scenario() -> tuple[dict[bytes, bytes], dict[bytes, bytes], dict[str, int]]:
        async with cluster_kv(config) as kv:
            mirror: dict[bytes, bytes] = {}
            consumer = Consumer(config, mutation_log=MutationLog(tmp_path / "mlog.db"))
            task = asyncio.create_task(follow(consumer, mirror))
            for i in range(300):
                await kv.upsert(f"d{i}".encode(), f"first {i}".encode())
            victim.kill9()
            # written while the victim's vbuckets have no live active: the client retries
            # until the failover gives them one
            writes = [kv.upsert(f"d{i}".encode(), f"second {i}".encode()) for i in range(0, 300, 3)]
            failing = asyncio.create_task(asyncio.to_thread(failover, cluster, victim))
            await asyncio.gather(*writes)
            await failing
            for i in range(300, 400):
                await kv.upsert(f"d{i}".encode(), f"third {i}".encode())
            bucket = await read_bucket(kv, 400)
            await caught_up(consumer, kv)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await consumer.close()
            return mirror, bucket, consumer.counters

    mirror, bucket, counters = asyncio.run(scenario())
    # one DCP connection per node; the victim's streams moved onto the survivors' ones
    assert counters["sessions"] >= 3
    assert mirror == bucket
    assert len(bucket) >= 300  # the victim's unreplicated tail may be gone, nothing else


async def follow(consumer: Consumer, mirror: dict[bytes, bytes]) -> None:
    async for ev in consumer.stream(start="beginning", end="forever"):
        if isinstance(ev, events.Mutation):
            mirror[ev.key] = ev.value
        elif isinstance(ev, events.Deletion | events.Expiration):
            mirror.pop(ev.key, None)
        elif isinstance(ev, events.Rollback) and ev.rollback_seqno == 0:
            for key in [k for k in mirror if vbucket_for_key(k, VBUCKETS) == ev.vbucket]:
                del mirror[key]


async def read_bucket(kv: ClusterKV, count: int) -> dict[bytes, bytes]:
    out = {}
    for i in range(count):
        key = f"d{i}".encode()
        doc = await kv.get(vbucket_for_key(key, VBUCKETS), key)
        if doc is not None:
            out[key] = doc.value
    return out


async def caught_up(consumer: Consumer, kv: ClusterKV) -> None:
    highs = await kv.vbucket_seqnos()
    for _ in range(1200):
        offsets = consumer.offsets
        if all(vb in offsets and offsets.progress(vb).offset.seqno >= high
               for vb, (_, high) in highs.items()):  # fmt: skip
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the consumer never caught up with the bucket")


# -- durability -------------------------------------------------------------------------------


def test_wait_durable_raises_when_a_failover_lost_the_write(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    config = settings_of(*(cluster.name(n) for n in cluster.nodes))
    active = cluster.nodes[0]

    async def scenario() -> None:
        async with cluster_kv(config) as kv:
            assert kv.router.map is not None
            vb = kv.router.map.actives_of(cluster.name(active))[0]
            replica = cluster.node(str(kv.router.replicas(vb)[0]))
            kept_key, lost_key = key_in(vb, "kept"), key_in(vb, "lost")
            # persisted on the active and on the replica: survives what follows
            kept = await kv.upsert(kept_key, b"safe", persist_to=2, replicate_to=1)
            assert replica.proc is not None
            os.kill(replica.proc.pid, signal.SIGSTOP)  # the replica reads nothing more
            lost = await kv.upsert(lost_key, b"only on the active")
            with pytest.raises(DurabilityTimeoutError):
                await kv.wait_durable(lost, replicate_to=1, timeout=0.3)
            # the active dies, and so does the replica before reading what its socket holds:
            # it comes back with what it had persisted, without the write
            active.kill9()
            replica.kill9()
            replica.start(same_port=True)
            await asyncio.to_thread(failover, cluster, active)
            with pytest.raises(DurabilityLostError, match="may have lost the write"):
                await kv.wait_durable(lost, persist_to=1, timeout=30)
            await kv.wait_durable(kept, persist_to=1, timeout=30)  # the safe one is there
            assert (await kv.get(vb, lost_key)) is None
            doc = await kv.get(vb, kept_key)
            assert doc is not None and doc.value == b"safe"

    asyncio.run(scenario())


# -- the official SDK -------------------------------------------------------------------------


def test_the_official_sdk_routes_by_the_map_with_client_durability(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster as SdkCluster
    from couchbase.durability import ClientDurability, PersistTo, ReplicateTo
    from couchbase.exceptions import CouchbaseException, DurabilityImpossibleException
    from couchbase.options import ClusterOptions, UpsertOptions

    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    config = settings_of(*(cluster.name(n) for n in cluster.nodes))

    async def the_map() -> ClusterKV:
        async with cluster_kv(config) as kv:
            return kv

    vb_map = asyncio.run(the_map()).router.map
    assert vb_map is not None
    seeds = ",".join([dead_address(), *(cluster.name(n) for n in cluster.nodes)])
    sdk = SdkCluster(
        f"couchbase://{seeds}",
        ClusterOptions(PasswordAuthenticator("Administrator", "password")),
    )
    try:
        coll = sdk.bucket("default").default_collection()
        durable = UpsertOptions(durability=ClientDurability(ReplicateTo.ONE, PersistTo.ONE))
        keys = [f"sdk{i}" for i in range(16)]
        for key in keys:
            coll.upsert(key, {"k": key}, durable)
        with pytest.raises(DurabilityImpossibleException):  # one replica per vbucket
            coll.upsert("too-much", {}, UpsertOptions(durability=ClientDurability(ReplicateTo.TWO)))
        # routed by the map: each node holds active exactly the keys of its vbuckets
        expected: dict[str, int] = {}
        for key in [*keys, "too-much"]:  # the SDK writes first, then finds the replica missing
            active = vb_map.active(vbucket_for_key(key.encode(), VBUCKETS))
            assert active is not None
            expected[active] = expected.get(active, 0) + 1
        for node in cluster.nodes:
            assert active_items(node) == expected.get(cluster.name(node), 0)
        # after a failover the SDK follows the new map: the survivors take every write
        victim, survivors = cluster.nodes[0], cluster.nodes[1:]
        victim.kill9()
        failover(cluster, victim)
        after = [f"after{i}" for i in range(16)]
        for key in after:
            for attempt in range(40):
                try:
                    coll.upsert(key, {"k": key})
                    break
                except CouchbaseException:  # until the SDK has read the new map
                    assert attempt < 39, key
    finally:
        sdk.close()

    async def present() -> int:
        async with cluster_kv(config) as kv:
            assert cluster.name(victim) not in (kv.router.map.servers if kv.router.map else ())
            docs = {
                key: await kv.get(vbucket_for_key(key.encode(), VBUCKETS), key.encode())
                for key in [*keys, "too-much", *after]
            }
            assert all(docs[key] is not None for key in after)  # every write after the failover
            return sum(doc is not None for doc in docs.values())

    assert sum(active_items(n) for n in survivors) == asyncio.run(present())

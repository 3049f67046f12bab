"""The client library's DCP consumer (one connection per node, following the map) through a
rebalance in (2 -> 3 nodes) and out (3 -> 2) under writes: every vbucket that moves ends its
stream with StateChanged and resumes on its new active from the same offset, with no rollback
(the failover log moves with the vbucket), and the consumer ends equal to the bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from test_cluster_clients import caught_up, cluster_kv, read_bucket, settings_of

from dcpkv.client import events
from dcpkv.client.consumer import Consumer
from support.managerproc import ManagerProcess, start_cluster
from support.rebalancecheck import rebalance
from support.serverproc import ServerProcess


def test_the_consumer_follows_moves_without_a_rollback_and_ends_equal(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    third = server_factory(tmp_path / "n2", tmp_path / "n2.log", "--managed", "--vbuckets", "16")
    third.start()
    seeds = [*(cluster.name(n) for n in cluster.nodes), f"127.0.0.1:{third.port}"]
    config = settings_of(*seeds)

    async def scenario() -> tuple[dict[bytes, bytes], dict[bytes, bytes], dict[str, int]]:
        async with cluster_kv(config) as kv:
            mirror: dict[bytes, bytes] = {}
            seen: dict[str, int] = {"rollbacks": 0, "stream_ends": 0}
            consumer = Consumer(config)
            task = asyncio.create_task(follow_counting(consumer, mirror, seen))

            async def write(round_: str, count: int) -> None:
                for i in range(count):
                    await kv.upsert(f"d{i}".encode(), f"{round_} {i}".encode())

            await write("before", 200)
            name = f"127.0.0.1:{third.port}"
            await asyncio.to_thread(
                cluster.manager.api, "POST", "/controller/addNode", hostname=name
            )
            moving = asyncio.create_task(asyncio.to_thread(rebalance, cluster.manager))
            await write("during-in", 200)
            assert (await moving)["state"] == "idle"
            moving = asyncio.create_task(
                asyncio.to_thread(
                    rebalance, cluster.manager, ejectedNodes=cluster.name(cluster.nodes[0])
                )
            )
            await write("during-out", 200)
            assert (await moving)["state"] == "idle"
            await write("after", 50)
            bucket = await read_bucket(kv, 200)
            await caught_up(consumer, kv)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await consumer.close()
            return mirror, bucket, seen

    mirror, bucket, seen = asyncio.run(scenario())
    assert seen["rollbacks"] == 0  # a move is not a failover: nobody rolls back
    assert seen["stream_ends"] > 0  # streams did move (StateChanged, then resumed)
    assert mirror == bucket and len(bucket) == 200


async def follow_counting(
    consumer: Consumer, mirror: dict[bytes, bytes], seen: dict[str, int]
) -> None:
    async for ev in consumer.stream(start="beginning", end="forever"):
        if isinstance(ev, events.Mutation):
            mirror[ev.key] = ev.value
        elif isinstance(ev, events.Deletion | events.Expiration):
            mirror.pop(ev.key, None)
        elif isinstance(ev, events.Rollback):
            seen["rollbacks"] += 1
        elif isinstance(ev, events.StreamEnd) and ev.will_resume:
            seen["stream_ends"] += 1

"""The election shell (cluster/election.py) on a real etcd member: a manager that steps down
gives up the lease that held the leader key. Found by ``chaos.py --etcd``: an etcd member's
kill moved etcd's raft leader, the leading manager's keep-alive came back after its own
deadline, it stepped down, the leader key's delete timed out during etcd's election, and the
manager kept that lease alive as a follower: the key named it for good, no manager led again
(85 s, to the end of the run)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from dcpkv.cluster.election import Elector
from dcpkv.cluster.etcd_store import LEADER_KEY, connect, parse_endpoints
from support.etcdproc import EtcdCluster, etcd_cluster


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path_factory.mktemp("etcd"), 1) as cluster:
        yield cluster


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + 20.0
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        await asyncio.sleep(0.05)


def test_a_manager_that_steps_down_gives_up_the_lease_that_held_the_leader_key(
    etcd: EtcdCluster,
) -> None:
    async def run() -> None:
        client = connect(parse_endpoints(etcd.endpoints))
        await client.delete_prefix(b"/dcpkv")
        terms: list[int] = []

        async def elected(term: int) -> None:
            terms.append(term)

        async def deposed(why: str) -> None:
            return None

        elector = Elector(client, "m0", "http://127.0.0.1:1", 3, elected, deposed)
        task = asyncio.get_running_loop().create_task(elector.run())

        async def leads() -> bool:
            return elector.leading

        await until(leads, "the lead")
        held = await client.get(LEADER_KEY)
        assert held is not None and json.loads(held.value)["name"] == "m0"
        lease = held.lease
        await elector.step_down("a keep-alive answered past the deadline")
        # (the key may go by the delete or with the lease; the lease must go either way)

        async def lease_gone() -> bool:
            info = await client.get_lease_info(lease)
            return bool(info.TTL <= 0)

        await until(lease_gone, "the old lease revoked")
        await until(leads, "the lead again, on a new lease")  # nobody else campaigns
        held = await client.get(LEADER_KEY)
        assert held is not None and held.lease != lease
        assert len(terms) == 2 and terms[1] > terms[0]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()

    asyncio.run(run())

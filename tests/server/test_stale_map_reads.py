"""A client whose map is out of date reads seqnos and failover logs from the *active*, never
from a copy the old map points at: two real managed nodes, a vbucket moved from A to B by hand
(the manager's part done over the wire), and a ClusterKV that bootstrapped before the move.

A node's vbucket-seqno stat and GetFailoverLog answer for its dead and replica copies too (as
kv_engine's do). A consumer kept across Spark batches meets no NotMyVbucket that would teach it
the new map, so without the active check it took the old copy's uuid and seqno for the
vbucket's: the Spark source planned rollbacks that were not there (each a re-read or a
resync of the vbucket). And a node restarted after a failover holds its old vbuckets active
(its disk's states) until the manager says otherwise: the client refreshes its map first."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from test_replication import push

from dcpkv.client.cluster import ClusterKV
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.vbucket import VBucketState, vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.replicacheck import VBUCKETS, admin, failover_logs
from support.serverproc import ServerProcess

MOVED = 1


def set_state(srv: ServerProcess, vbuckets: range | list[int], state: VBucketState) -> None:
    with admin(srv.port) as c:
        for vb in vbuckets:
            extras = struct.pack(">I", state)
            assert c.call(Opcode.SetVbucket, extras=extras, vbucket=vb).status == 0


def write_to(srv: ServerProcess, vb: int, count: int, prefix: str) -> None:
    keys = [k for i in range(400) if vbucket_for_key(k := f"{prefix}{i}".encode(), VBUCKETS) == vb]
    with admin(srv.port) as c:
        for key in keys[:count]:
            assert c.set(key, b"v", vbucket=vb).status == 0


def stat_row(srv: ServerProcess, vb: int) -> tuple[int, int]:
    with admin(srv.port) as c:
        stats = c.stats(f"vbucket-seqno {vb}".encode())
    return int(stats[f"vb_{vb}:uuid"]), int(stats[f"vb_{vb}:high_seqno"])


def test_a_client_with_an_old_map_reads_the_new_active(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    a, b = (server_factory(tmp_path / n, tmp_path / f"{n}.log", "--managed") for n in "ab")
    for srv in (a, b):
        srv.start()
    servers = [f"127.0.0.1:{s.port}" for s in (a, b)]
    set_state(a, range(VBUCKETS), VBucketState.ACTIVE)
    for srv in (a, b):
        push(srv, servers, [[0]] * VBUCKETS, rev=1)
    write_to(a, MOVED, 2, "before")
    config = ClientSettings(ConnectionSettings.at(port=a.port), retry_timeout=10.0, max_backoff=0.2)

    async def scenario() -> tuple[dict[int, tuple[int, int]], ...]:
        kv = await ClusterKV.open(config)
        try:
            assert kv.router.active(MOVED).port == a.port  # bootstrapped before the move
            # the move: B takes the vbucket (a new branch), A's copy is dead, the map says so
            set_state(b, [MOVED], VBucketState.ACTIVE)
            set_state(a, [MOVED], VBucketState.DEAD)
            rows = [[0]] * VBUCKETS
            rows[MOVED] = [1]
            for srv in (a, b):
                push(srv, servers, rows, rev=2)
            write_to(b, MOVED, 3, "after")
            every = await kv.vbucket_seqnos()
            one = await kv.vbucket_seqnos(MOVED)
            logs = await kv.failover_logs([MOVED, 0])
            return every, one, logs
        finally:
            await kv.close()

    every, one, logs = asyncio.run(scenario())
    new_active = stat_row(b, MOVED)
    assert new_active[1] == 3 and stat_row(a, MOVED)[1] == 2  # the two copies differ
    assert every[MOVED] == new_active
    assert one == {MOVED: new_active}
    assert every[0] == stat_row(a, 0)  # the vbuckets that stayed are read where they are
    assert logs[MOVED] == failover_logs(b.port, [MOVED])[MOVED]
    assert logs[MOVED] != failover_logs(a.port, [MOVED])[MOVED]
    assert isinstance(logs[0][0], FailoverEntry)


def test_a_restarted_node_that_still_holds_the_vbucket_active_is_not_asked(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """A died and B was promoted (the map's rev 2, which A never got); A is back, holding
    the vbucket active from its disk and serving its old map. The client bootstrapped before
    the failover and has seen no error since: it must read B."""
    a, b = (server_factory(tmp_path / n, tmp_path / f"{n}.log", "--managed") for n in "ab")
    for srv in (a, b):
        srv.start()
    servers = [f"127.0.0.1:{s.port}" for s in (a, b)]
    set_state(a, range(VBUCKETS), VBucketState.ACTIVE)
    for srv in (a, b):
        push(srv, servers, [[0]] * VBUCKETS, rev=1)
    write_to(a, MOVED, 2, "before")
    config = ClientSettings(ConnectionSettings.at(port=a.port), retry_timeout=10.0, max_backoff=0.2)

    async def scenario() -> dict[int, tuple[int, int]]:
        kv = await ClusterKV.open(config)
        try:
            set_state(b, [MOVED], VBucketState.ACTIVE)
            rows = [[0]] * VBUCKETS
            rows[MOVED] = [1]
            push(b, servers, rows, rev=2)  # only B: A was down when the failover happened
            write_to(b, MOVED, 3, "after")
            return await kv.vbucket_seqnos()
        finally:
            await kv.close()

    every = asyncio.run(scenario())
    assert stat_row(a, MOVED)[1] == 2  # A still holds its copy active
    assert every[MOVED] == stat_row(b, MOVED)

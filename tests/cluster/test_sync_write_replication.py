"""SyncWrites replicated between real nodes (PROTOCOL.md, "SyncWrites"): a two-node cluster built
by the manager, the active vbucket's topology set by hand with SetVbucket's JSON value (the
manager does not set topologies yet). The replica's DCP connection to the active enables
SyncWrites and names itself; a durable write commits only on its acknowledgement, a
PersistToMajority one only once the replica persisted the prepare, and the replica's readers
(a DCP consumer without SyncWrites) never see an uncommitted prepare. Frames by the raw client."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from couchbase.durability import DurabilityLevel, ServerDurability
from couchbase.options import UpsertOptions

from support.managerproc import Cluster, ManagerProcess, start_cluster, wait_for
from support.rawclient import DCP_MUTATION, Packet, RawClient
from support.sdkhelp import connect
from support.serverproc import ServerProcess

GET, SET, SET_VBUCKET, OBSERVE_SEQNO, GET_CLUSTER_CONFIG = 0x00, 0x01, 0x3D, 0x91, 0xB5
SUCCESS, KEY_ENOENT, AMBIGUOUS = 0x00, 0x01, 0xA3
DCP_PREPARE, DCP_ABORT = 0x60, 0x63
ALT_REQUEST, MUTATION_SEQNO, SYNC_REPLICATION = 0x10, 0x04, 0x11
SET_EXTRAS = struct.pack(">II", 0, 0)
ACTIVE_STATE = 1
MAJORITY, PERSIST_TO_MAJORITY = 1, 3
NOBODY_HERE = "127.0.0.1:1"  # a replica name no node has


def durability(level: int, timeout_ms: int | None = None) -> bytes:
    if timeout_ms is None:
        return bytes((0x11, level))
    return bytes((0x13, level)) + struct.pack(">H", timeout_ms)


@contextmanager
def connected(node: ServerProcess) -> Iterator[RawClient]:
    raw = RawClient(node.port)
    try:
        assert SYNC_REPLICATION in raw.hello(ALT_REQUEST, MUTATION_SEQNO, SYNC_REPLICATION)
        raw.login()
        yield raw
    finally:
        raw.close()


def chains(node: ServerProcess) -> tuple[list[str], list[list[int]]]:
    with connected(node) as raw:
        answer = raw.call(GET_CLUSTER_CONFIG)
    if answer.status != SUCCESS or not answer.value:
        return [], []
    vbmap = json.loads(answer.value).get("vBucketServerMap", {})
    return vbmap.get("serverList", []), vbmap.get("vBucketMap", [])


def a_replicated_vbucket(cluster: Cluster) -> tuple[int, ServerProcess, ServerProcess]:
    """A vbucket with its active and its replica, once the replica streams it."""
    found: list[tuple[int, ServerProcess, ServerProcess]] = []

    def mapped() -> bool:
        servers, rows = chains(cluster.nodes[0])
        for vb, row in enumerate(rows):
            if len(row) == 2 and min(row) >= 0 and row[0] != row[1]:
                found[:] = [(vb, cluster.node(servers[row[0]]), cluster.node(servers[row[1]]))]
                return True
        return False

    wait_for(mapped, "a map with replicas", timeout_s=60)
    vb, active, replica = found[0]
    with connected(active) as raw:
        answer = raw.call(SET, b"warm-up", b"w", SET_EXTRAS, vbucket=vb)
        assert answer.status == SUCCESS, answer
        seqno = struct.unpack(">QQ", answer.extras)[1]
    with connected(replica) as raw:
        wait_for(lambda: raw.high_seqno(vb) >= seqno, "the replica streaming", timeout_s=60)
    return vb, active, replica


def set_topology(node: ServerProcess, vb: int, chain: list[str]) -> None:
    with connected(node) as raw:
        value = json.dumps({"topology": [chain]}).encode()
        answer = raw.call(SET_VBUCKET, value=value, extras=bytes((ACTIVE_STATE,)), vbucket=vb)
        assert answer.status == SUCCESS, answer


def stream(node: ServerProcess, vb: int, *, sync_writes: bool) -> list[Packet]:
    """Everything a DCP consumer of ``node``'s copy of ``vb`` gets up to its high seqno."""
    with connected(node) as raw:
        high = raw.high_seqno(vb)
        raw.dcp_open(f"reader-{sync_writes}", 0)
        if sync_writes:
            assert raw.control("enable_sync_writes", "true") == SUCCESS
        assert raw.stream_request(vb, end=high).status == SUCCESS
        return raw.stream_until_end()


def seen(packets: list[Packet], key: bytes) -> list[tuple[int, bytes]]:
    return [(p.opcode, p.value) for p in packets if p.key == key]


def no_answer_yet(raw: RawClient) -> bool:
    raw.sock.settimeout(0.2)
    try:
        raw.sock.recv(1, socket.MSG_PEEK)
    except TimeoutError:
        return True
    finally:
        raw.sock.settimeout(10.0)
    return False


def persisted_on(node: ServerProcess, vb: int, uuid: int) -> int:
    with connected(node) as raw:
        answer = raw.call(OBSERVE_SEQNO, value=struct.pack(">Q", uuid), vbucket=vb)
    assert answer.status == SUCCESS, answer
    fmt, _vb, got_uuid, persisted, _current = struct.unpack_from(">BHQQQ", answer.value)
    assert (fmt, got_uuid) == (0, uuid)
    return int(persisted)


def test_a_durable_write_commits_on_the_replicas_ack_and_replica_readers_see_no_prepare(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    vb, active, replica = a_replicated_vbucket(cluster)
    me, them = cluster.name(active), cluster.name(replica)

    # A topology whose replica is no node: the prepare reaches the replica, which acknowledges
    # it, but an ack from a node the topology does not name commits nothing.
    set_topology(active, vb, [me, NOBODY_HERE])
    with connected(active) as raw:
        before = raw.high_seqno(vb)
        raw.send(SET, b"k", b"v1", SET_EXTRAS, vbucket=vb, framing=durability(MAJORITY))
        with connected(replica) as on_replica:
            wait_for(lambda: on_replica.high_seqno(vb) > before, "the prepare on the replica")
        assert (DCP_PREPARE, b"v1") in seen(stream(replica, vb, sync_writes=True), b"k")
        assert seen(stream(replica, vb, sync_writes=False), b"k") == []  # no dirty read
        assert no_answer_yet(raw)
        # The topology names the replica: its ack, kept, commits the prepare.
        set_topology(active, vb, [me, them])
        answer = raw.recv()
        assert answer.status == SUCCESS, answer
        uuid, commit_seqno = struct.unpack(">QQ", answer.extras)
        with connected(replica) as on_replica:
            wait_for(lambda: on_replica.high_seqno(vb) >= commit_seqno, "the commit replicated")
        assert seen(stream(replica, vb, sync_writes=False), b"k") == [(DCP_MUTATION, b"v1")]

        # PersistToMajority: answered once the replica persisted the prepare (the commit
        # follows the prepare at once on a vbucket nobody else writes to).
        answer = raw.call(
            SET, b"p", b"v2", SET_EXTRAS, vbucket=vb, framing=durability(PERSIST_TO_MAJORITY)
        )
        assert answer.status == SUCCESS, answer
        _uuid, commit_seqno = struct.unpack(">QQ", answer.extras)
        assert persisted_on(replica, vb, uuid) >= commit_seqno - 1

        # The replica paused: nobody acknowledges, the write ends ambiguous at its timeout.
        assert replica.proc is not None
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            answer = raw.call(
                SET, b"a", b"v3", SET_EXTRAS, vbucket=vb, framing=durability(MAJORITY, 500)
            )
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        assert answer.status == AMBIGUOUS, answer
        assert raw.call(GET, b"a", vbucket=vb).status == KEY_ENOENT
        high = raw.high_seqno(vb)
    with connected(replica) as on_replica:
        wait_for(lambda: on_replica.high_seqno(vb) >= high, "the abort replicated")
    assert seen(stream(replica, vb, sync_writes=False), b"a") == []
    # from memory the prepare and its abort; from disk the abort (it replaced its prepare)
    ops = [op for op, _ in seen(stream(replica, vb, sync_writes=True), b"a")]
    assert ops in ([DCP_PREPARE, DCP_ABORT], [DCP_ABORT])


def test_the_official_sdk_writes_durably_through_the_replica(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
    sdk: list[Any],
) -> None:
    """ServerDurability at Majority and PersistToMajority succeeds once every active vbucket
    has its topology (set by hand), and the replica holds what was acknowledged."""
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    a_replicated_vbucket(cluster)  # the map is built and replication runs
    servers, rows = chains(cluster.nodes[0])
    for vb, (active, replica) in enumerate(rows):
        set_topology(cluster.node(servers[active]), vb, [servers[active], servers[replica]])
    coll = connect(cluster.nodes[0], sdk, kv_timeout_s=10)
    levels = (DurabilityLevel.MAJORITY, DurabilityLevel.PERSIST_TO_MAJORITY)
    written = {}
    for i in range(32):
        key, level = f"durable-{i}", levels[i % 2]
        token = coll.upsert(key, {"i": i}, UpsertOptions(durability=ServerDurability(level)))
        written[key] = token.mutation_token()
    for key, token in written.items():
        assert coll.get(key).content_as[dict] == {"i": int(key.split("-")[1])}
        vb = token.partition_id
        replica = cluster.node(servers[rows[vb][1]])
        with connected(replica) as raw:  # acknowledged: the replica had its prepare (the
            # seqno before its commit's: one writer), while the commit may still be on its way
            assert raw.high_seqno(vb) >= token.sequence_number - 1

"""The Spark source on a cluster (managed nodes and ``dcpkv manager`` as processes): the
partitions are planned by node, the tasks reach the nodes through a connection string (one of
its seeds dead), and an AvailableNow query stays exact across a kill -9 and a failover."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sparkhelp import Changelog, Workload, stream_available_now

from dcpkv.client.cluster import ClusterKV
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.client.writer import KVWriter, WriteOp
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.spark.options import parse_options
from dcpkv.spark.plan import targets
from dcpkv.spark.source import _partitions, active_nodes
from dcpkv.spark.sparkoffsets import SparkOffsets, VbPosition
from support.managerproc import VBUCKETS, ManagerProcess, start_cluster, tracked_managers
from support.serverproc import ServerProcess


def write(conn: ConnectionSettings, start: int, count: int, tag: str) -> None:
    with KVWriter(conn, VBUCKETS) as writer:
        writer.write(
            WriteOp(f"s{i % 150}".encode(), value=f"{tag}{i}".encode()) for i in range(start, count)
        )


def truth(conn: ConnectionSettings) -> dict[bytes, bytes]:
    async def read() -> dict[bytes, bytes]:
        kv = await ClusterKV.open(ClientSettings(conn))
        try:
            out = {}
            for i in range(150):
                key = f"s{i}".encode()
                doc = await kv.get(vbucket_for_key(key, VBUCKETS), key)
                if doc is not None:
                    out[key] = doc.value
            return out
        finally:
            await kv.close()

    return asyncio.run(read())


def test_an_available_now_query_on_a_cluster_plans_by_node_and_survives_a_failover(
    spark: Any, server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    with tracked_managers() as managers:
        cluster = start_cluster(server_factory, managers, tmp_path, nodes=3, replicas=1)
        run(spark, cluster, managers, tmp_path)


def run(spark: Any, cluster: Any, managers: type[ManagerProcess], tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    names = [cluster.name(n) for n in cluster.nodes]
    connection_string = f"couchbase://{dead},{','.join(names)}"
    conn = ConnectionSettings.parse(connection_string)
    write(conn, 0, 400, "a")
    # planning: every task reads from one node only, and every node's vbuckets are read
    opts = parse_options({"connectionString": connection_string, "numPartitions": "6"})
    node_of = active_nodes(opts)
    assert set(node_of.values()) == set(names) and len(node_of) == VBUCKETS
    start = SparkOffsets({vb: VbPosition.at(0, 0) for vb in range(VBUCKETS)})
    end = SparkOffsets({vb: VbPosition.at(5, 1) for vb in range(VBUCKETS)})
    parts = _partitions(targets(start, end), opts)
    assert all(len({node_of[t.vbucket] for t in p.work}) == 1 for p in parts)
    # the query, through the connection string (executors get it in the options)
    log = Changelog()
    checkpoint = tmp_path / "checkpoint"
    options = {"connectionString": connection_string, "numPartitions": "6"}
    stream_available_now(spark, 0, checkpoint, log, **options)
    assert log.live() == truth(conn)
    # a node dies and is failed over; the writes go on; the next run is exact again
    victim = cluster.nodes[0]
    victim.kill9()
    done = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "cluster", "failover", names[0],
         "--url", cluster.manager.url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    write(conn, 400, 700, "b")
    stream_available_now(spark, 0, checkpoint, log, **options)
    assert log.live() == truth(conn)


def test_an_available_now_query_rides_through_a_node_restart(
    spark: Any, server: ServerProcess, tmp_path: Path
) -> None:
    """kill -9 of the only node between two batches, back half a second later: the tasks'
    and the driver's connections retry with backoff, the query does not fail, and its
    output is exact (rollback rows for the writes the crash lost)."""
    work = Workload(server.port)
    work.run(600)
    log = Changelog()  # written by foreachBatch's thread; the test only reads its length
    runner, failure = run_in_background(
        lambda: stream_available_now(
            spark,
            server.port,
            tmp_path / "cp",
            log,
            maxChangesPerTrigger="100",
            numPartitions="2",
        )
    )
    wait_first_batch(log, runner, 0)
    server.kill9()
    time.sleep(0.5)
    server.start(same_port=True)
    runner.join(timeout=600)
    assert not runner.is_alive() and not failure, failure
    # the server's documents first: a Get expires what is due, so the expirations are in
    # the change stream before the last run reads it
    truth = work.truth()
    stream_available_now(spark, server.port, tmp_path / "cp", log)  # what came after
    assert log.live() == truth


def run_in_background(query: Any) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``query()`` in a thread; its exception, if any, lands in the list."""
    failure: list[BaseException] = []

    def guarded() -> None:
        try:
            query()
        except BaseException as exc:  # handed to the test's thread
            failure.append(exc)

    runner = threading.Thread(target=guarded)
    runner.start()
    return runner, failure


def wait_first_batch(log: Changelog, runner: threading.Thread, before: int) -> None:
    """Until the running query applied a batch beyond the ``before`` it started with."""
    deadline = time.monotonic() + 300
    while len(log.batch_sizes) <= before and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_an_available_now_query_stays_exact_through_a_rebalance_and_a_failover_mid_run(
    spark: Any, server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """Small batches (maxChangesPerTrigger) so the faults land while the query runs: a
    rebalance in (2 -> 3 nodes) moves vbuckets under it with no rollback row; a kill -9 and
    failover of a node gives rollback rows only for vbuckets that node held active; both
    runs end with the output equal to the bucket, and the query never fails."""
    from support.rebalancecheck import rebalance, served_map

    with tracked_managers() as managers:
        cluster = start_cluster(server_factory, managers, tmp_path, nodes=2, replicas=1)
        third = server_factory(tmp_path / "n2", tmp_path / "n2.log", "--managed", "--vbuckets",
                               str(VBUCKETS))  # fmt: skip
        third.start()
        names = [cluster.name(n) for n in cluster.nodes] + [f"127.0.0.1:{third.port}"]
        options = {"connectionString": "couchbase://" + ",".join(names),
                   "maxChangesPerTrigger": "40", "numPartitions": "3"}  # fmt: skip
        conn = ConnectionSettings.parse(options["connectionString"])
        log, checkpoint = Changelog(), tmp_path / "checkpoint"

        def query() -> None:
            stream_available_now(spark, 0, checkpoint, log, **options)

        # a rebalance in while the query runs: vbuckets move, nothing is lost
        write(conn, 0, 600, "a")
        runner, failure = run_in_background(query)
        wait_first_batch(log, runner, 0)
        assert runner.is_alive(), "the query ended before the rebalance"
        cluster.manager.api("POST", "/controller/addNode", hostname=names[2])
        assert rebalance(cluster.manager)["state"] == "idle"
        runner.join(timeout=600)
        assert not runner.is_alive() and not failure, failure
        stream_available_now(spark, 0, checkpoint, log, **options)
        assert log.rollbacks == [], "a clean move must not roll back"
        assert log.live() == truth(conn)
        # a kill -9 and a failover while the next run reads
        write(conn, 600, 1200, "b")
        nodes = [*cluster.nodes, third]
        vb_map = served_map(nodes)
        victim = nodes[1]
        held = {vb for vb, chain in enumerate(vb_map.chains)
                if vb_map.servers[chain[0]] == cluster.name(victim)}  # fmt: skip
        before = len(log.batch_sizes)
        runner, failure = run_in_background(query)
        wait_first_batch(log, runner, before)
        assert runner.is_alive(), "the query ended before the failover"
        victim.kill9()
        cluster.manager.api("POST", "/controller/failOver", otpNode=cluster.name(victim))
        runner.join(timeout=600)
        assert not runner.is_alive() and not failure, failure
        stream_available_now(spark, 0, checkpoint, log, **options)
        assert {vb for vb, _seqno in log.rollbacks} <= held
        assert log.live() == truth(conn)

"""A data node's Prometheus metrics (dcpkv.server.metrics, dcpkv.server.latency): the naming
rules, the histogram, and a real node's port scraped and checked by ``promtool``."""

from __future__ import annotations

import json
import struct
import urllib.request
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.server.latency import BOUNDS_S, LatencyHistogram
from dcpkv.server.metrics import connection_type, op_name
from support.kvclient import KVClient, Writer
from support.promcheck import promtool_check, samples
from support.rawclient import RawClient
from support.serverproc import ServerProcess


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("Replica:127.0.0.1:11210", "replication"),
        ("replication:ns_1@a->ns_1@b:default", "replication"),
        ("dcpkv-spark:4242:0123456789ab", "spark"),
        ("dcpkv-stream", "other"),
        ("", "other"),
        ("replica:lower-case-is-not-ours", "other"),
    ],
)
def test_a_dcp_connection_type_comes_from_its_name(name: str, kind: str) -> None:
    assert connection_type(name) == kind


@pytest.mark.parametrize(
    ("opcode", "op"), [(0x00, "get"), (0x01, "set"), (0x11, "setq"), (0xFD, "0xfd")]
)
def test_an_opcode_is_named_by_the_protocol(opcode: int, op: str) -> None:
    assert op_name(opcode) == op


def test_the_histogram_counts_at_or_below_each_bound() -> None:
    h = LatencyHistogram()
    for ns in (10_000, 10_001, 3_000_000, 2_000_000_000):
        h.observe(ns)
    buckets, total = h.cumulative()
    assert [le for le, _ in buckets] == [*map(str, BOUNDS_S), "+Inf"]
    by_le = dict(buckets)
    assert by_le["1e-05"] == 1  # a bound is inclusive (Prometheus' le)
    assert by_le["2.5e-05"] == 2
    assert by_le["0.0025"] == 2 and by_le["0.005"] == 3
    assert by_le["1.0"] == 3 and by_le["+Inf"] == 4
    assert [c for _, c in buckets] == sorted(c for _, c in buckets)  # cumulative
    assert total == pytest.approx(2.003020001)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def metrics_port(port: int) -> int:
    with KVClient(port) as kv:
        kv.login()
        return int(kv.stats()["metrics_port"])


@pytest.fixture
def node(server_factory: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    """A node serving metrics on a free loopback port."""
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", "--metrics-port", "0")
    srv.start()
    return srv


def test_a_node_serves_its_metrics_on_loopback_and_promtool_accepts_them(
    node: ServerProcess,
) -> None:
    port = metrics_port(node.port)
    assert port > 0
    with Writer(node.port) as writer:
        for i in range(40):
            writer.set(f"key-{i}".encode(), b"value")
    with KVClient(node.port) as kv:
        kv.login()
        for i in range(10):
            assert (
                kv.get(f"key-{i}".encode(), vbucket=writer.vb_of(f"key-{i}".encode())).status
                == Status.Success
            )
        assert KVClient(node.port).login("Administrator", "wrong").status == Status.AuthError
    text = scrape(port)
    promtool_check(text)
    got = samples(text)
    assert got['kv_ops{op="set"}'] == 40
    assert got['kv_ops{op="get"}'] == 10
    assert got['kv_curr_items{bucket="default"}'] == 40
    assert got['kv_vb_curr_items{bucket="default",state="active"}'] == 40
    assert got['kv_num_vbuckets{bucket="default",state="active"}'] == 16
    assert got["kv_auth_errors"] == 1
    assert got["kv_cmd_batch_duration_seconds_count"] >= 50
    assert got['kv_dcp_items_remaining{bucket="default",connection_type="replication"}'] == 0
    assert got['kv_vb_sync_write_committed_count{bucket="default"}'] == 0


def test_metrics_are_off_unless_asked_for(server: ServerProcess) -> None:
    assert metrics_port(server.port) == 0


def test_sync_writes_are_counted_and_their_commits_timed(node: ServerProcess) -> None:
    raw = RawClient(node.port)
    assert 0x11 in raw.hello(0x10, 0x11)  # AltRequest, SyncReplication
    raw.login()
    me = f"127.0.0.1:{node.port}"
    for vb, chain in ((3, [me]), (5, [me, "absent-replica"])):
        value = json.dumps({"topology": [chain]}).encode()
        assert raw.call(0x3D, value=value, extras=b"\x01", vbucket=vb).status == 0  # active
    extras = struct.pack(">II", 0, 0)
    for level in (1, 3, 3):  # Majority, PersistToMajority: committed alone
        framing = bytes((0x11, level))
        assert raw.call(0x01, b"k%d" % level, b"v", extras, vbucket=3, framing=framing).status == 0
    timeout = bytes((0x13, 1)) + struct.pack(">H", 300)  # the replica never acknowledges
    answer = raw.call(0x01, b"waits", b"v", extras, vbucket=5, framing=timeout)
    assert answer.status == 0xA3  # SyncWriteAmbiguous
    raw.close()
    text = scrape(metrics_port(node.port))
    promtool_check(text)
    got = samples(text)
    b = '{bucket="default"}'
    assert got[f"kv_vb_sync_write_accepted_count{b}"] == 4
    assert got[f"kv_vb_sync_write_committed_count{b}"] == 3
    assert got[f"kv_vb_sync_write_aborted_count{b}"] == 1
    count = "kv_sync_write_commit_duration_seconds_count"
    assert got[f'{count}{{level="majority"}}'] == 1
    assert got[f'{count}{{level="persist_to_majority"}}'] == 2
    assert f'{count}{{level="majority_and_persist_on_master"}}' not in got

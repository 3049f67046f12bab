"""The configuration in a real etcd (cluster/etcd_store.py): every write is conditioned on
the revision read and, for a leader, on its leadership key: no update is lost, a deposed
leader writes nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dcpkv.cluster import config as cfg
from dcpkv.cluster.etcd_store import LEADER_KEY, EtcdStore, connect, parse_endpoints
from dcpkv.cluster.store import FileStore, StoreConflict
from dcpkv.core.rbac import Role, UserRecord, UsersDoc
from support.etcdproc import EtcdCluster, etcd_cluster


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path_factory.mktemp("etcd"), 1) as cluster:
        yield cluster


BUCKET = cfg.new_bucket("default", 16, 0)


def config(timeout_s: int) -> cfg.ClusterConfig:
    settings = replace(cfg.FailoverConfig(), auto_failover_timeout_s=timeout_s)
    return cfg.ClusterConfig(
        nodes=(cfg.NodeConfig("127.0.0.1:1"),), buckets=(BUCKET,), settings=settings
    )


def test_a_write_based_on_an_old_read_is_refused(etcd: EtcdCluster) -> None:
    async def run() -> None:
        client = connect(parse_endpoints(etcd.endpoints))
        await client.delete_prefix(b"/dcpkv")
        one, two = EtcdStore(client), EtcdStore(client)
        assert await one.load() is None and await two.load() is None
        await one.save(config(5))
        with pytest.raises(StoreConflict):  # two read "nothing": stale
            await two.save(config(6))
        assert (await two.load()) == config(5)
        await two.save(config(7))
        with pytest.raises(StoreConflict):
            await one.save(config(8))
        assert (await EtcdStore(client).load()) == config(7)
        await client.close()

    asyncio.run(run())


def test_a_fenced_store_writes_only_while_its_leader_key_stands(etcd: EtcdCluster) -> None:
    async def run() -> None:
        client = connect(parse_endpoints(etcd.endpoints))
        await client.delete_prefix(b"/dcpkv")
        put = await client.put(LEADER_KEY, b"m1")
        term = put.header.revision
        leader = EtcdStore(client, term=term)
        await leader.load()
        await leader.save(config(5))
        await client.delete(LEADER_KEY)  # its lease expired
        await client.put(LEADER_KEY, b"m2")  # and another manager won
        with pytest.raises(StoreConflict):
            await leader.save(config(6))
        assert (await EtcdStore(client).load()) == config(5)
        await client.close()

    asyncio.run(run())


def test_the_file_store_round_trips(tmp_path: Path) -> None:
    async def run() -> None:
        store = FileStore(tmp_path)
        assert await store.load() is None
        await store.save(config(9))
        assert await FileStore(tmp_path).load() == config(9)
        await store.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        ("127.0.0.1:2379", [("127.0.0.1", 2379)]),
        ("http://a:1, b:2", [("a", 1), ("b", 2)]),
    ],
)
def test_endpoints(given: str, parsed: list[tuple[str, int]]) -> None:
    assert parse_endpoints(given) == parsed


@pytest.mark.parametrize("bad", ["", "a", "a:b", ":1"])
def test_bad_endpoints_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not an etcd endpoint"):
        parse_endpoints(bad)


def test_users_are_written_as_the_configuration_is(etcd: EtcdCluster) -> None:
    async def run() -> None:
        client = connect(parse_endpoints(etcd.endpoints))
        await client.delete_prefix(b"/dcpkv")
        one, two = EtcdStore(client), EtcdStore(client)
        assert (await one.load_users()).rev == 0 and (await two.load_users()).rev == 0
        reader = (Role.parse("data_reader[default]"),)
        ann = UsersDoc().with_user(UserRecord.create("ann", "pw", reader, 4096))
        await one.save_users(ann)
        with pytest.raises(StoreConflict):
            await two.save_users(UsersDoc().with_user(ann.users["ann"]))
        assert (await EtcdStore(client).load_users()).encode() == ann.encode()
        await client.close()

    asyncio.run(run())


def test_the_manager_refuses_a_bad_etcd_endpoint_in_one_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "dcpkv.cli.main", "manager", "--etcd", "nohost",
            "--port", "0", "--data-dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().endswith("'nohost' is not an etcd endpoint (host:port)")

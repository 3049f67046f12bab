"""Users and TLS on a cluster of real processes: the manager serves its API over https, talks
to its nodes over TLS, and pushes the users it is given (``dcpkv user --manager``) to every
node."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from dcpkv.core.status import Status
from dcpkv.protocol.constants import Opcode
from support.kvclient import KVClient
from support.managerproc import ManagerProcess, wait_for
from support.serverproc import ServerProcess
from support.tlscerts import Certs, make_certs, sdk_cluster

OFFSET = -3  # a node's TLS port is its data port - 3 (11210 / 11207), the manager's default


def free_pair() -> int:
    """A port P with P and P - 3 both free (a node's data and TLS ports)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        try:
            with socket.socket() as other:
                other.bind(("127.0.0.1", port + OFFSET))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of ports")


def tls_node(factory: type[ServerProcess], tmp: Path, i: int, certs: Certs) -> ServerProcess:
    port = free_pair()
    node = factory(tmp / f"n{i}", tmp / f"n{i}.log", "--managed", "--tls-port",
                   str(port + OFFSET), "--tls-cert", str(certs.server_cert),
                   "--tls-key", str(certs.server_key))  # fmt: skip
    node.port = port
    node.start(same_port=True)
    assert node.tls_port == port + OFFSET
    return node


def manager_args(certs: Certs, ca: Path, nodes: list[ServerProcess]) -> list[str]:
    seeds = [arg for n in nodes for arg in ("--node", f"127.0.0.1:{n.port}")]
    return ["--replicas", "1", "--vbuckets", "16", "--tls-cert", str(certs.server_cert),
            "--tls-key", str(certs.server_key), "--node-tls-ca", str(ca), *seeds]  # fmt: skip


def user_cli(manager: ManagerProcess, certs: Certs, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DCPKV_MANAGER_CA": str(certs.ca)}
    argv = [sys.executable, "-m", "dcpkv.cli.main", "user", *args,
            "--manager", f"https://127.0.0.1:{manager.port}"]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def sdk_over_tls(node: ServerProcess, certs: Certs) -> None:
    """The official SDK through couchbases://: the map's kvSSL ports lead it to both nodes."""
    cluster = sdk_cluster(node.tls_port, certs.ca)
    try:
        coll = cluster.bucket("default").default_collection()
        docs = {f"sdk-{i}": {"i": i} for i in range(32)}  # spread over both nodes' vbuckets
        for key, doc in docs.items():
            coll.upsert(key, doc)
        assert {k: coll.get(k).content_as[dict] for k in docs} == docs
    finally:
        cluster.close()


def login_status(node: ServerProcess, user: str, password: str) -> int:
    with KVClient(node.port) as kv:
        return kv.login(user, password).status


def test_users_reach_every_node_through_an_https_manager_over_tls_links(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
) -> None:
    certs = make_certs(tmp_path / "certs")
    nodes = [tls_node(server_factory, tmp_path, i, certs) for i in range(2)]
    # links that do not trust the nodes' certificate cannot drive them
    doubting = manager_factory(tmp_path / "m0", tmp_path / "m0.log",
                               *manager_args(certs, certs.other_ca, nodes))  # fmt: skip
    doubting.start()
    wait_for(lambda: "CERTIFICATE_VERIFY_FAILED" in doubting.log(), "a refused TLS link")
    doubting.reap()
    manager = manager_factory(tmp_path / "m1", tmp_path / "m1.log",
                              *manager_args(certs, certs.ca, nodes))  # fmt: skip
    manager.start()

    added = user_cli(manager, certs, "add", "alice", "--role", "data_dcp_reader[default]",
                     "--password", "a-pw")  # fmt: skip
    assert added.returncode == 0, added.stderr
    for node in nodes:
        wait_for(lambda n=node: login_status(n, "alice", "a-pw") == Status.Success, "alice")
        with KVClient(node.port) as kv:
            assert kv.login("alice", "a-pw").status == Status.Success
            assert kv.set(b"k", b"v").status == Status.Eaccess
    sdk_over_tls(nodes[0], certs)
    listed = user_cli(manager, certs, "list")
    assert "alice  data_dcp_reader[default]" in listed.stdout
    assert b"a-pw" not in (tmp_path / "m1" / "users.json").read_bytes()

    changed = user_cli(manager, certs, "passwd", "alice", "--password", "b-pw")
    assert changed.returncode == 0, changed.stderr
    assert user_cli(manager, certs, "remove", "alice").returncode == 0
    for node in nodes:
        assert login_status(node, "alice", "b-pw") == Status.AuthError
    # the plain http URL is not served any more, and a wrong admin is refused
    refused = user_cli(manager, certs, "list", "--admin-password", "wrong")
    assert refused.returncode == 1 and "authentication required" in refused.stderr
    with KVClient(nodes[0].port) as kv:  # the cluster admin still drives the nodes
        assert kv.login().status == Status.Success
        assert kv.call(Opcode.Noop).status == Status.Success

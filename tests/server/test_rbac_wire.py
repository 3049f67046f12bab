"""Users and roles against a real server: users made with ``dcpkv user`` (a subprocess), each
opcode checked against its role, refusals answered Eaccess and counted, failed logins
throttled per address, and the least-privilege commands (``dcpkv stream``, ``dcpkv stats``)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol.constants import Opcode
from dcpkv.protocol.frame import Frame
from support.dcpclient import DcpClient
from support.kvclient import KVClient
from support.serverproc import ServerProcess, tracked_servers

USERS = {
    "reader": "data_reader[default]",
    "writer": "data_writer[default]",
    "streamer": "data_dcp_reader[default]",
    "badmin": "bucket_admin[default]",
}
PASSWORD = "pw-of-each"


def dcpkv(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dcpkv.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def add_user(data_dir: Path, name: str, role: str, password: str = PASSWORD) -> None:
    done = dcpkv("user", "add", name, "--role", role, "--password", password,
                 "--data-dir", str(data_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("rbac")
    with tracked_servers() as factory:
        srv = factory(root / "data", root / "server.log")
        for name, role in USERS.items():
            add_user(srv.data_dir, name, role)
        srv.start()
        yield srv


def login(server: ServerProcess, user: str, password: str = PASSWORD) -> KVClient:
    client = KVClient(server.port)
    assert client.login(user, password).status == Status.Success
    assert client.call(Opcode.SelectBucket, key=b"default").status == Status.Success
    return client


def eaccess_count(server: ServerProcess) -> int:
    with login(server, "Administrator", "password") as admin:
        return int(admin.stats()["rbac_eaccess"])


SET_VB = struct.pack(">B", VBucketState.ACTIVE)
# user -> opcode -> allowed
CASES = [
    ("reader", "get", True), ("reader", "set", False), ("reader", "dcp_open", False),
    ("reader", "stat", True), ("reader", "set_vbucket", False),
    ("writer", "set", True), ("writer", "get", False), ("writer", "dcp_open", False),
    ("writer", "incr", False), ("writer", "flush", False),
    ("streamer", "dcp_open", True), ("streamer", "get", True), ("streamer", "set", False),
    ("streamer", "delete", False), ("streamer", "set_cluster_config", False),
    ("badmin", "set", True), ("badmin", "dcp_open", True), ("badmin", "set_vbucket", False),
    ("badmin", "del_vbucket", False), ("badmin", "rbac_refresh", False),
    # sub-document: a lookup is a read, a mutation a write
    ("reader", "subdoc_get", True), ("reader", "subdoc_upsert", False),
    ("reader", "subdoc_multi_mutation", False), ("writer", "subdoc_upsert", True),
    ("writer", "subdoc_get", False), ("writer", "subdoc_multi_lookup", False),
    ("streamer", "subdoc_upsert", False),
    # XDCR: a with-meta write is a write, GetMeta a read
    ("writer", "set_with_meta", True), ("reader", "set_with_meta", False),
    ("streamer", "del_with_meta", False), ("reader", "get_meta", True),
]  # fmt: skip


def attempt(client: KVClient, what: str) -> int:
    calls = {
        "get": lambda: client.get(b"k"),
        "set": lambda: client.set(b"k", b"v"),
        "delete": lambda: client.call(Opcode.Delete, key=b"k"),
        "incr": lambda: client.arith(Opcode.Increment, b"n", 1),
        "flush": lambda: client.call(Opcode.Flush),
        "stat": lambda: client.call(Opcode.Stat, key=b"vbucket"),
        "dcp_open": lambda: client.call(
            Opcode.DcpOpen, key=b"rbac-test", extras=struct.pack(">II", 0, 1)
        ),
        "set_vbucket": lambda: client.call(Opcode.SetVbucket, vbucket=0, extras=SET_VB),
        "del_vbucket": lambda: client.call(Opcode.DelVbucket, vbucket=0),
        "set_cluster_config": lambda: client.call(
            Opcode.SetClusterConfig, key=b"default", value=b'{"rev":99}'
        ),
        "rbac_refresh": lambda: client.call(Opcode.RbacRefresh, value=b'{"rev":99,"users":{}}'),
        "set_with_meta": lambda: client.call(
            Opcode.SetWithMeta, key=b"xk", value=b"v", extras=struct.pack(">IIQQ", 0, 0, 1, 1)
        ),
        "del_with_meta": lambda: client.call(
            Opcode.DelWithMeta, key=b"xk", extras=struct.pack(">IIQQ", 0, 0, 9, 9)
        ),
        "get_meta": lambda: client.call(Opcode.GetMeta, key=b"k"),
        "subdoc_get": lambda: subdoc(client, Opcode.SubdocGet, b"f"),
        "subdoc_upsert": lambda: subdoc(client, Opcode.SubdocDictUpsert, b"f", b"1"),
        "subdoc_multi_lookup": lambda: client.call(
            Opcode.SubdocMultiLookup, key=b"doc", value=struct.pack(">BBH", 0xC5, 0, 1) + b"f"
        ),
        "subdoc_multi_mutation": lambda: client.call(
            Opcode.SubdocMultiMutation,
            key=b"doc",
            value=struct.pack(">BBHI", 0xC8, 0, 1, 1) + b"f" + b"2",
        ),
    }
    return calls[what]().status


def subdoc(client: KVClient, opcode: int, path: bytes, value: bytes = b"") -> Frame:
    extras = struct.pack(">HB", len(path), 0)
    return client.call(opcode, key=b"doc", extras=extras, value=path + value)


@pytest.mark.parametrize(("user", "what", "allowed"), CASES)
def test_each_opcode_checks_its_role(
    server: ServerProcess, user: str, what: str, allowed: bool
) -> None:
    before = eaccess_count(server)
    with login(server, user) as client:
        status = attempt(client, what)
    if allowed:
        assert status != Status.Eaccess
    else:
        assert status == Status.Eaccess
    assert eaccess_count(server) == before + (0 if allowed else 1)


def test_no_role_on_a_bucket_means_no_select(server: ServerProcess) -> None:
    with KVClient(server.port) as client:
        assert client.login("reader", PASSWORD).status == Status.Success
        assert client.call(Opcode.SelectBucket, key=b"other").status == Status.Eaccess
        # not selected on login either when the user has no role on the first bucket: fine
        # here (reader has one), so the default bucket works without SelectBucket
        assert client.get(b"nothing").status == Status.KeyEnoent


def test_a_user_added_while_running_logs_in_at_once(server: ServerProcess) -> None:
    with KVClient(server.port) as client:
        assert client.login("late", "late-pw").status == Status.AuthError
    add_user(server.data_dir, "late", "data_reader[default]", "late-pw")
    with login(server, "late", "late-pw") as client:
        assert client.set(b"k", b"v").status == Status.Eaccess
    listed = dcpkv("user", "list", "--json", "--data-dir", str(server.data_dir))
    assert {"id": "late", "roles": ["data_reader[default]"]} in json.loads(listed.stdout)
    assert dcpkv("user", "remove", "late", "--data-dir", str(server.data_dir)).returncode == 0
    with KVClient(server.port) as client:
        assert client.login("late", "late-pw").status == Status.AuthError


def test_a_dcp_reader_streams_with_the_cli_but_cannot_write(server: ServerProcess) -> None:
    with login(server, "writer") as writer:
        for i in range(20):
            assert writer.set(f"doc-{i}".encode(), b'{"n":1}').status == Status.Success
    done = dcpkv("stream", "--port", str(server.port), "--user", "streamer",
                 "--password", PASSWORD, "--to", "now")  # fmt: skip
    assert done.returncode == 0, done.stderr
    keys = {json.loads(line)["key"] for line in done.stdout.splitlines()}
    assert {f"doc-{i}" for i in range(20)} <= keys
    stats = dcpkv("stats", "--port", str(server.port), "--user", "streamer", "--password", PASSWORD)
    assert stats.returncode == 0 and "curr_items" in stats.stdout
    client = DcpClient(server.port, "rbac:streamer", user="streamer", password=PASSWORD)
    try:
        answer = client.call_raw(Opcode.Set, key=b"x", value=b"y", extras=struct.pack(">II", 0, 0))
        assert answer.status == Status.Eaccess
    finally:
        client.close()


def test_passwd_changes_the_password(server: ServerProcess) -> None:
    add_user(server.data_dir, "pat", "data_reader[default]", "old-pw")
    done = dcpkv("user", "passwd", "pat", "--password", "new-pw", "--data-dir",
                 str(server.data_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    with KVClient(server.port) as client:
        assert client.login("pat", "old-pw").status == Status.AuthError
    login(server, "pat", "new-pw").close()


def test_failed_logins_are_throttled_per_address(tmp_path: Path) -> None:
    with tracked_servers() as factory:
        srv = factory(tmp_path / "data", tmp_path / "server.log")
        add_user(srv.data_dir, "victim", "data_reader[default]")
        srv.start()
        with KVClient(srv.port) as client:
            for _ in range(5):
                assert client.login("victim", "guess").status == Status.AuthError
            refused = client.login("victim", PASSWORD)  # right, but too late
            assert refused.status == Status.AuthError
            assert b"Too many failed logins" in bytes(refused.value)
        with KVClient(srv.port) as other:  # another address is not held
            other.sock.close()
            other.sock = socket.create_connection(
                ("127.0.0.1", srv.port), timeout=10, source_address=("127.0.0.2", 0)
            )
            assert other.login("victim", PASSWORD).status == Status.Success
            stats = other.stats()
        assert int(stats["auth_errors"]) == 5
        assert int(stats["auth_throttled"]) == 1


def test_a_dcp_name_of_another_user_cannot_be_taken_over(server: ServerProcess) -> None:
    owner = DcpClient(server.port, "rbac:owned", user="badmin", password=PASSWORD)
    try:
        other = DcpClient(server.port, user="streamer", password=PASSWORD, open_=False)
        try:
            answer = other.call_raw(
                Opcode.DcpOpen, key=b"rbac:owned", extras=struct.pack(">II", 0, 1)
            )
            assert answer.status == Status.KeyEexists
        finally:
            other.close()
        assert owner.call_raw(Opcode.DcpNoop).status != Status.Eaccess  # still open
        assert not owner.closed
    finally:
        owner.close()

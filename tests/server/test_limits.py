"""Limits that keep one client from hurting the others (issue 17, item 3), over real sockets.

Each test starts its own server (some with small limits) and reads its resident memory from
``/proc/<pid>/status``: a flood of large frames must leave it where it was.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.protocol.constants import Magic, Opcode
from support.kvclient import KVClient, poll_rounds
from support.serverproc import ServerProcess

MIB = 1 << 20


def rss(server: ServerProcess) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def set_header(value_len: int, key: bytes = b"big") -> bytes:
    """A Set request's header, extras and key, announcing ``value_len`` bytes of value."""
    body = 8 + len(key) + value_len
    head = struct.pack(
        ">BBHBBHIIQ", Magic.ClientRequest, Opcode.Set, len(key), 8, 0, 0, body, 0xF100D, 0
    )
    return head + struct.pack(">II", 0, 0) + key


def send_big_set(port: int, value_len: int, sent: int, *, login: bool) -> int | None:
    """Announce a Set of ``value_len`` bytes, send ``sent`` of them, close. The status the
    server answered before we closed, if it did."""
    with KVClient(port, timeout=5) as kv:
        sock = kv.sock
        if login:
            assert kv.login().status == Status.Success
        sock.sendall(set_header(value_len))
        chunk = b"x" * MIB
        try:
            for _ in range(sent // MIB):
                sock.sendall(chunk)
        except OSError:
            pass  # the server refused at the header and closed: expected before login
        sock.settimeout(0.2)
        try:
            answer = sock.recv(24)
        except OSError:
            return None
        return struct.unpack(">H", answer[6:8])[0] if len(answer) >= 8 else None


def settle(server: ServerProcess, limit: int) -> int:
    """Wait (bounded) for the server's RSS to come down to ``limit``; the last reading."""
    for _ in poll_rounds(10, 0.1):
        now = rss(server)
        if now <= limit:
            return now
    return rss(server)


def healthy(port: int) -> None:
    with KVClient(port) as kv:
        assert kv.login().status == Status.Success
        assert kv.set(b"still-here", b"yes").status == Status.Success
        assert kv.get(b"still-here").value == b"yes"


def test_unauthenticated_large_frames_are_refused_from_the_header(server: ServerProcess) -> None:
    """40 connections that never log in, each announcing a 21 MB Set and sending what the
    socket takes, then closing: each is answered E2big from its header and closed; the
    server's memory stays where it was, and it serves everyone else throughout."""
    healthy(server.port)
    before = rss(server)
    statuses = [send_big_set(server.port, 21 * MIB, 21 * MIB, login=False) for _ in range(40)]
    assert all(s in (Status.E2big, None) for s in statuses) and Status.E2big in statuses
    healthy(server.port)
    assert settle(server, before + 8 * MIB) <= before + 8 * MIB


def test_a_closed_connection_frees_what_it_buffered_at_once(server: ServerProcess) -> None:
    """Logged-in clients that send half of a 16 MB value and vanish: the half they sent is
    freed when they close, not at some later garbage collection."""
    healthy(server.port)
    before = rss(server)
    for _ in range(12):
        assert send_big_set(server.port, 16 * MIB, 8 * MIB, login=True) is None
    healthy(server.port)
    assert settle(server, before + 12 * MIB) <= before + 12 * MIB


@pytest.fixture
def limited(server_factory: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    server = server_factory(
        tmp_path / "data", tmp_path / "server.log", "--max-connections", "4",
        "--unauth-timeout", "1",
    )  # fmt: skip
    server.start()
    return server


def closed_by_server(sock: socket.socket, wait_s: float) -> bool:
    sock.settimeout(wait_s)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_past_max_connections_a_connection_is_closed_and_counted(limited: ServerProcess) -> None:
    kept = [KVClient(limited.port) for _ in range(4)]
    for kv in kept:
        assert kv.login().status == Status.Success
    extra = socket.create_connection(("127.0.0.1", limited.port), timeout=5)
    assert closed_by_server(extra, 2.0)
    extra.close()
    kept.pop().close()
    for _ in poll_rounds(5, 0.05):  # its slot frees once the server saw the close
        try:
            with KVClient(limited.port) as again:
                if again.login().status == Status.Success:
                    break
        except OSError:
            continue  # refused: the server has not seen the close yet
    stats = kept[0].stats()
    assert int(stats["rejected_conns"]) >= 1 and int(stats["max_connections"]) == 4
    for kv in kept:
        kv.close()


def test_a_connection_that_never_logs_in_is_closed_after_the_timeout(
    limited: ServerProcess,
) -> None:
    silent = socket.create_connection(("127.0.0.1", limited.port), timeout=5)
    with KVClient(limited.port) as kv:
        assert kv.login().status == Status.Success
        started = time.monotonic()
        assert closed_by_server(silent, 5.0)  # the 1 s timeout, checked every second
        assert time.monotonic() - started < 4.5
        assert kv.get(b"nothing").status == Status.KeyEnoent  # the logged-in one stays
        assert int(kv.stats()["unauth_timeouts"]) == 1
    silent.close()

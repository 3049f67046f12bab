"""Background fetches over the wire: a real server whose full-eviction bucket warmed up with
no item in memory, so every key read is a background fetch (``engine/bg_fetch.py``).

Several connections pipeline Gets of non-resident keys at once: each gets every value right,
in its own request order. Meanwhile a Get of a resident key on another connection is
answered: the loop is not stopped by the reads (a connection waiting for a fetch waits alone).
"""

from __future__ import annotations

import struct
from pathlib import Path

from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.frame import encode_frame
from dcpkv.server.fast_path import pipelined_gets
from support.kvclient import KVClient
from support.serverproc import ServerProcess

ITEMS = 6000
VBUCKETS = 16  # (ServerProcess starts its servers with 16)
CONNECTIONS = 4


def value_of(key: bytes) -> bytes:
    return b"value-of-" + key


def test_concurrent_gets_of_non_resident_keys(server_factory: type, tmp_path: Path) -> None:
    keys = [key_of(i) for i in range(ITEMS)]
    srv = on_disk_only(server_factory, tmp_path, keys)
    clients = [KVClient(srv.port, timeout=120) for _ in range(CONNECTIONS + 1)]
    try:
        for c in clients:
            c.login()
        resident = clients[-1]
        assert resident.set(b"resident", b"here", vbucket=vb_of(b"resident")).status == 0
        shares = [keys[i::CONNECTIONS] for i in range(CONNECTIONS)]
        # All sent before any is read; Get (the fast path's opcode) and GetK (the general
        # path's) on alternate connections
        opcodes = [Opcode.Get if i % 2 else Opcode.GetK for i in range(CONNECTIONS)]
        for c, share, op in zip(clients, shares, opcodes, strict=False):
            c.send(b"".join(c.frame(op, key=k, vbucket=vb_of(k)) for k in share))
        # While the readers' fetches are pending, a resident key is answered
        got = resident.get(b"resident", vbucket=vb_of(b"resident"))
        assert (got.status, bytes(got.value)) == (Status.Success, b"here")
        fetched_by_then = int(resident.stats()["ep_bg_fetched"])
        assert fetched_by_then < ITEMS, fetched_by_then  # (the readers are not done)
        for c, share, op in zip(clients, shares, opcodes, strict=False):
            answers = [c.recv_frame() for _ in share]
            with_key = op == Opcode.GetK
            assert [(a.status, bytes(a.key), bytes(a.value)) for a in answers] == [
                (Status.Success, k if with_key else b"", value_of(k)) for k in share
            ]
        stats = resident.stats()
        assert int(stats["ep_bg_fetched"]) >= ITEMS
        assert 0 < int(stats["bg_fetch_waits"]) <= ITEMS  # (pipelined Gets: read in batches)
        missing = resident.get(b"never-written", vbucket=vb_of(b"never-written"))
        assert missing.status == Status.KeyEnoent
    finally:
        for c in clients:
            c.close()
    assert srv.terminate() == 0


def test_a_pipeline_mixing_fetches_misses_and_writes_is_answered_in_order(
    server_factory: type, tmp_path: Path
) -> None:
    """One connection pipelines Gets of non-resident keys, of keys never written (read in the
    batch of the Gets they follow: a miss answers KeyEnoent), a Set of a new key and a Get of
    it, a Delete of a non-resident key and a Get of it: the batches of reads land together and
    every answer comes back in request order, with its own opaque."""
    keys = [key_of(i) for i in range(300)]
    srv = on_disk_only(server_factory, tmp_path, keys)
    with KVClient(srv.port, timeout=120) as c:
        c.login()
        requests, expected = mixed_pipeline(c, keys)
        c.send(b"".join(requests))
        answers = [c.recv_frame() for _ in requests]
        opaques = [struct.unpack_from(">I", r, 12)[0] for r in requests]
        assert [a.opaque for a in answers] == opaques
        assert [(a.status, bytes(a.value)) for a in answers] == expected
    assert srv.terminate() == 0


def on_disk_only(server_factory: type, tmp_path: Path, keys: list[bytes]) -> ServerProcess:
    """A full-eviction server that wrote ``keys`` (values ``value_of``: a wrong key's value
    would show), restarted: its warm-up loads no items, so every key is on disk only."""
    srv: ServerProcess = server_factory(
        tmp_path / "data", tmp_path / "log", "--eviction-policy", "fullEviction"
    )
    srv.start()
    with KVClient(srv.port, timeout=60) as c:
        c.login()
        c.send(b"".join(set_frame(c, k) for k in keys))
        assert all(c.recv_frame().status == Status.Success for _ in keys)
    assert srv.terminate() == 0
    srv.start()
    return srv


def mixed_pipeline(c: KVClient, keys: list[bytes]) -> tuple[list[bytes], list[tuple[int, bytes]]]:
    """The requests of the mixed pipeline, and the (status, value) each must be answered."""
    requests: list[bytes] = []
    expected: list[tuple[int, bytes]] = []

    def ask(frame: bytes, status: int, value: bytes = b"") -> None:
        requests.append(frame)
        expected.append((status, value))

    for i, key in enumerate(keys):
        ask(get_frame(c, key), Status.Success, value_of(key))
        if i % 3 == 0:
            ask(get_frame(c, b"never-%d" % i), Status.KeyEnoent)
        if i % 50 == 7:
            new = b"new-%d" % i
            ask(set_frame(c, new), Status.Success)
            ask(get_frame(c, new), Status.Success, value_of(new))
        if i % 50 == 9:
            gone = keys[i - 5]
            ask(c.frame(Opcode.Delete, key=gone, vbucket=vb_of(gone)), Status.Success)
            ask(get_frame(c, gone), Status.KeyEnoent)
    return requests, expected


def get_frame(c: KVClient, key: bytes) -> bytes:
    return c.frame(Opcode.GetK, key=key, vbucket=vb_of(key))


def key_of(i: int) -> bytes:
    return b"bg-%08d" % i


def vb_of(key: bytes) -> int:
    return vbucket_for_key(key, VBUCKETS)


def set_frame(c: KVClient, key: bytes) -> bytes:
    extras = struct.pack(">II", 0, 0)
    return c.frame(Opcode.Set, key=key, value=value_of(key), extras=extras, vbucket=vb_of(key))


def test_pipelined_gets_finds_the_gets_behind_a_parked_request() -> None:
    """What a parked connection prefetches: the plain Gets among the whole frames buffered
    behind it, across chunks, up to the limit; a partial frame ends the look."""
    gets = [
        encode_frame(Magic.ClientRequest, Opcode.GetK, key=key_of(i), vbucket=vb_of(key_of(i)))
        for i in range(3)
    ]
    a_set = encode_frame(Magic.ClientRequest, Opcode.Set, key=b"w", extras=bytes(8), value=b"v")
    chunks: list[bytes | memoryview] = [gets[0] + a_set, memoryview(gets[1] + gets[2][:30])]
    found, seen = pipelined_gets(chunks, limit=10)
    assert found == [(vb_of(key_of(0)), key_of(0)), (vb_of(key_of(1)), key_of(1))]
    assert seen == 3
    assert pipelined_gets(chunks, limit=1) == ([(vb_of(key_of(0)), key_of(0))], 1)

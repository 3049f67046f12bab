"""With-meta writes (XDCR) against a real server: requests encoded with the protocol module
(the official SDK sends none of these), answers read back as frames."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.protocol import kv
from dcpkv.protocol.constants import HelloFeature, Opcode
from dcpkv.protocol.frame import Frame
from dcpkv.protocol.kv import WithMetaOption as Option
from support.kvclient import KVClient, poll_rounds
from support.serverproc import ServerProcess

SRC_CAS = 0x1780_0000_0000_0000  # a CAS from "another cluster"


@pytest.fixture
def client(server: ServerProcess) -> Iterator[KVClient]:
    with KVClient(server.port) as c:
        assert c.login().status == Status.Success
        yield c


def persisted(client: KVClient, vb: int) -> None:
    """Poll ObserveSeqno until the vbucket's high seqno is on disk."""
    uuid = int(client.stats(b"vbucket-seqno %d" % vb)[f"vb_{vb}:uuid"])
    for _ in poll_rounds():
        _, _, _, on_disk, current = struct.unpack(">BHQQQ", client.observe(vb, uuid).value)
        if on_disk >= current:
            return


def send(client: KVClient, msg: kv.Request) -> Frame:
    client.send(msg.encode())
    return client.recv_frame()


def meta(client: KVClient, key: bytes, vbucket: int = 0) -> tuple[int, kv.GetMetaResponse]:
    frame = send(client, kv.GetMeta(key=key, vbucket=vbucket, version=2))
    assert frame.status == Status.Success, frame
    return frame.cas, kv.GetMetaResponse.decode(frame)


def set_with_meta(
    client: KVClient, key: bytes, value: bytes, *, rev: int, cas: int, op: type = kv.SetWithMeta,
    **kw: object,
) -> Frame:  # fmt: skip
    return send(client, op(key=key, value=value, rev_seqno=rev, meta_cas=cas, **kw))


def test_a_with_meta_write_keeps_the_source_cas_and_rev_and_takes_a_local_seqno(
    client: KVClient,
) -> None:
    client.hello(HelloFeature.JSON)  # GetMeta's datatype byte shows the bits negotiated
    client.set(b"before", b"x")  # seqno 1 of vbucket 0
    done = set_with_meta(client, b"doc", b'{"a":1}', rev=7, cas=SRC_CAS, flags=3, datatype=1)
    assert done.status == Status.Success and done.cas == SRC_CAS
    cas, got = meta(client, b"doc")
    assert (cas, got.rev_seqno, got.flags, got.deleted, got.item_datatype) == (
        SRC_CAS, 7, 3, False, 1,
    )  # fmt: skip
    assert client.get(b"doc").value == b'{"a":1}'
    stats = client.stats(b"vbucket-seqno 0")
    assert int(stats["vb_0:high_seqno"]) == 2
    # a local write after it gets a CAS above the one it adopted (the HLC observed it)
    assert client.set(b"doc", b"local").cas > SRC_CAS


def test_conflict_resolution_by_revision_refuses_losers_and_echoes(client: KVClient) -> None:
    assert set_with_meta(client, b"k", b"v5", rev=5, cas=100).status == Status.Success
    # the echo of what the key already holds: identical, refused
    assert set_with_meta(client, b"k", b"v5", rev=5, cas=100).status == Status.KeyEexists
    # a lower rev loses whatever its CAS
    assert set_with_meta(client, b"k", b"old", rev=4, cas=10**18).status == Status.KeyEexists
    # same rev, higher CAS wins
    assert set_with_meta(client, b"k", b"v5b", rev=5, cas=101).status == Status.Success
    # a forced write skips conflict resolution
    forced = set_with_meta(client, b"k", b"forced", rev=1, cas=1, options=Option.FORCE)
    assert forced.status == Status.Success
    assert client.get(b"k").value == b"forced"
    # a losing quiet write answers; a winning one does not (a Noop ends the batch)
    client.send(kv.SetqWithMeta(key=b"k", value=b"q", rev_seqno=9, meta_cas=9, opaque=71).encode())
    client.send(kv.SetqWithMeta(key=b"k", value=b"q", rev_seqno=9, meta_cas=9, opaque=72).encode())
    client.send(kv.Noop(opaque=73).encode())
    answers = [client.recv_frame(), client.recv_frame()]
    assert [(f.opaque, f.status) for f in answers] == [(72, Status.KeyEexists), (73, 0)]


def test_add_and_delete_with_meta_and_tombstones(client: KVClient) -> None:
    assert set_with_meta(client, b"a", b"1", rev=3, cas=300, op=kv.AddWithMeta).status == 0
    # a live document blocks AddWithMeta, even a winning one
    add_again = set_with_meta(client, b"a", b"2", rev=9, cas=900, op=kv.AddWithMeta)
    assert add_again.status == Status.KeyEexists
    # a delete with a lower rev loses; a higher one wins and leaves a tombstone
    assert send(client, kv.DelWithMeta(key=b"a", rev_seqno=2, meta_cas=999)).status == (
        Status.KeyEexists
    )
    gone = send(client, kv.DelWithMeta(key=b"a", rev_seqno=4, meta_cas=400, expiration=1234))
    assert gone.status == Status.Success and gone.cas == 400
    assert client.get(b"a").status == Status.KeyEnoent
    cas, got = meta(client, b"a")
    assert (cas, got.deleted, got.rev_seqno) == (400, True, 4)
    # the tombstone still judges once flushed out of memory
    persisted(client, 0)
    echo = send(client, kv.DelWithMeta(key=b"a", rev_seqno=4, meta_cas=400))
    assert echo.status == Status.KeyEexists
    # a tombstone does not block AddWithMeta, but conflict resolution still applies
    assert set_with_meta(client, b"a", b"x", rev=4, cas=399, op=kv.AddWithMeta).status == (
        Status.KeyEexists
    )
    assert set_with_meta(client, b"a", b"x", rev=5, cas=500, op=kv.AddWithMeta).status == 0
    # GetqMeta: a miss is silent, a hit answers
    client.send(kv.GetqMeta(key=b"never", opaque=5).encode())
    client.send(kv.GetqMeta(key=b"a", opaque=6).encode())
    hit = client.recv_frame()
    assert (hit.opcode, hit.opaque, hit.cas) == (Opcode.GetqMeta, 6, 500)


@pytest.mark.parametrize(
    ("extras_len", "options", "status"),
    [
        (24, None, Status.Success),
        (26, None, Status.Success),  # nmeta
        (28, 0, Status.Success),
        (30, 0, Status.Success),
        (20, None, Status.Einval),
        (32, None, Status.Einval),
        (28, 0x80, Status.Einval),  # unknown option
        (28, int(Option.REGENERATE_CAS), Status.Einval),  # needs skip-CR
        (28, int(Option.FORCE_ACCEPT), Status.Einval),  # a revision bucket
        (28, int(Option.IS_EXPIRATION), Status.Einval),  # a set
    ],
)
def test_extras_and_options_are_checked(
    client: KVClient, extras_len: int, options: int | None, status: int
) -> None:
    extras = kv.WITH_META.pack(0, 0, 1, 77)
    if extras_len in (28, 30):
        extras += (options or 0).to_bytes(4, "big")
    if extras_len in (26, 30):
        extras += b"\0\0"
    if extras_len not in (24, 26, 28, 30):
        extras = extras[:extras_len].ljust(extras_len, b"\0")
    frame = client.call(Opcode.SetWithMeta, key=b"opt", value=b"v", extras=extras)
    assert frame.status == status, frame.value


def test_regenerate_cas_stores_a_local_cas(client: KVClient) -> None:
    options = int(Option.REGENERATE_CAS | Option.SKIP_CONFLICT_RESOLUTION)
    done = set_with_meta(client, b"r", b"v", rev=2, cas=5, options=options)
    assert done.status == Status.Success and done.cas not in (0, 5)
    assert meta(client, b"r")[0] == done.cas


def test_a_timestamp_bucket_resolves_by_cas_and_is_fixed_at_creation(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    srv = server_factory(tmp_path / "data", tmp_path / "lww.log", "--conflict-resolution", "lww")
    srv.start()
    with KVClient(srv.port) as c:
        assert c.login().status == Status.Success
        assert set_with_meta(c, b"k", b"a", rev=9, cas=1000).status == Status.Success
        # a higher rev but an older CAS loses by timestamp
        assert set_with_meta(c, b"k", b"b", rev=99, cas=999).status == Status.KeyEexists
        assert set_with_meta(c, b"k", b"c", rev=1, cas=1001).status == Status.Success
        forced = set_with_meta(c, b"k", b"d", rev=1, cas=1002, options=int(Option.FORCE_ACCEPT))
        assert forced.status == Status.Success
    srv.terminate()
    again = server_factory(tmp_path / "data", tmp_path / "seqno.log",
                           "--conflict-resolution", "seqno")  # fmt: skip
    with pytest.raises(RuntimeError, match="exited"):  # the process refuses to start
        again.start()
    assert "fixed at creation" in (tmp_path / "seqno.log").read_text()

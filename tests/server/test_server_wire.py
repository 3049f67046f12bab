"""The data server over real sockets: a real ``dcpkv server`` subprocess and a real client."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.protocol.constants import HelloFeature, Magic, Opcode
from support.kvclient import KVClient, poll_rounds
from support.serverproc import ServerProcess


@pytest.fixture
def client(server: ServerProcess) -> KVClient:
    c = KVClient(server.port)
    assert c.login().status == Status.Success
    return c


def test_auth_gates(server: ServerProcess) -> None:
    with KVClient(server.port) as c:
        assert c.get(b"k").status == Status.Eaccess
        assert c.call(Opcode.SaslListMechs).status == Status.Success
        assert c.login(password="wrong").status == Status.AuthError
        assert c.get(b"k").status == Status.Eaccess
        assert c.login().status == Status.Success
        # no SelectBucket: a plain memcached client lands in the first bucket
        assert c.get(b"k").status == Status.KeyEnoent
        assert c.call(Opcode.SelectBucket, key=b"nope").status == Status.KeyEnoent
        assert c.call(Opcode.SelectBucket, key=b"default").status == Status.Success


def test_set_get_add_replace_with_cas_and_delete(client: KVClient) -> None:
    got = client.set(b"k", b"v1", flags=0x02000000)
    assert got.status == Status.Success and got.cas
    first_cas = got.cas
    got = client.get(b"k")
    assert (got.status, got.value, got.cas) == (Status.Success, b"v1", first_cas)
    assert struct.unpack(">I", got.extras) == (0x02000000,)
    assert client.set(b"k", b"v2", opcode=Opcode.Add).status == Status.KeyEexists
    assert client.set(b"nope", b"v", opcode=Opcode.Replace).status == Status.KeyEnoent
    replaced = client.set(b"k", b"v2", opcode=Opcode.Replace, cas=first_cas)
    assert replaced.status == Status.Success
    stale = client.set(b"k", b"v3", cas=first_cas)
    assert stale.status == Status.KeyEexists
    assert client.get(b"k").value == b"v2"
    assert client.call(Opcode.Delete, key=b"k", cas=first_cas).status == Status.KeyEexists
    assert client.call(Opcode.Delete, key=b"k").status == Status.Success
    assert client.get(b"k").status == Status.KeyEnoent
    assert client.call(Opcode.Delete, key=b"k").status == Status.KeyEnoent
    assert client.set(b"k", b"again", opcode=Opcode.Add).status == Status.Success
    getk = client.call(Opcode.GetK, key=b"k")
    assert (getk.key, getk.value) == (b"k", b"again")


def test_counters_concat_and_touch(client: KVClient) -> None:
    got = client.arith(Opcode.Increment, b"n", 5, initial=10)
    assert got.status == Status.Success and struct.unpack(">Q", got.value) == (10,)
    assert struct.unpack(">Q", client.arith(Opcode.Increment, b"n", 5).value) == (15,)
    assert struct.unpack(">Q", client.arith(Opcode.Decrement, b"n", 20).value) == (0,)
    missing = client.arith(Opcode.Increment, b"m", 1, expiry=0xFFFFFFFF)
    assert missing.status == Status.KeyEnoent
    client.set(b"word", b"abc")
    assert client.arith(Opcode.Increment, b"word", 1).status == Status.DeltaBadval
    assert client.call(Opcode.Append, key=b"word", value=b"def").status == Status.Success
    assert client.call(Opcode.Prepend, key=b"word", value=b">").status == Status.Success
    assert client.get(b"word").value == b">abcdef"
    assert client.call(Opcode.Append, key=b"none", value=b"x").status == Status.NotStored
    touch = client.call(Opcode.Touch, key=b"word", extras=struct.pack(">I", 1000))
    assert touch.status == Status.Success
    gat = client.call(Opcode.GAT, key=b"word", extras=struct.pack(">I", 1000))
    assert (gat.status, gat.value) == (Status.Success, b">abcdef")
    assert client.call(Opcode.Touch, key=b"gone", extras=b"\0" * 4).status == Status.KeyEnoent


def test_bad_extras_are_einval_and_store_nothing(client: KVClient) -> None:
    assert client.call(Opcode.Set, key=b"k", value=b"v").status == Status.Einval
    assert client.get(b"k").status == Status.KeyEnoent


def test_pipelined_requests_are_answered_in_order(client: KVClient) -> None:
    batch = []
    for i in range(100):
        if i % 2 == 0:
            extras = struct.pack(">II", 0, 0)
            batch.append(client.frame(Opcode.Set, key=b"p%d" % i, extras=extras, value=b"%d" % i))
        else:
            batch.append(client.frame(Opcode.Get, key=b"p%d" % (i - 1)))
    client.send(b"".join(batch))
    answers = [client.recv_frame() for _ in range(100)]
    assert [a.opaque for a in answers] == sorted(a.opaque for a in answers)
    assert all(a.status == Status.Success for a in answers)
    assert [a.value for a in answers[1::2]] == [b"%d" % i for i in range(0, 100, 2)]


def test_quiet_ops_answer_only_failures_then_noop(client: KVClient) -> None:
    extras = struct.pack(">II", 0, 0)
    batch = [
        client.frame(Opcode.SetQ, key=b"q1", extras=extras, value=b"one", opaque=1),
        client.frame(Opcode.GetQ, key=b"missing", opaque=2),
        client.frame(Opcode.GetKQ, key=b"q1", opaque=3),
        client.frame(Opcode.AddQ, key=b"q1", extras=extras, value=b"x", opaque=4),
        client.frame(Opcode.DeleteQ, key=b"q1", opaque=5),
        client.frame(Opcode.Noop, opaque=6),
    ]
    client.send(b"".join(batch))
    got = [client.recv_frame() for _ in range(3)]
    assert [(g.opaque, g.status) for g in got] == [
        (3, Status.Success),
        (4, Status.KeyEexists),
        (6, Status.Success),
    ]
    assert (got[0].key, got[0].value) == (b"q1", b"one")
    assert client.get(b"q1").status == Status.KeyEnoent


def test_not_my_vbucket_carries_the_cluster_map(client: KVClient) -> None:
    for vb, state in ((3, 2), (4, 4)):
        got = client.call(Opcode.SetVbucket, vbucket=vb, extras=struct.pack(">I", state))
        assert got.status == Status.Success
        assert struct.unpack(">I", client.call(Opcode.GetVbucket, vbucket=vb).value) == (state,)
    for vb in (3, 4, 99):
        got = client.set(b"k", b"v", vbucket=vb)
        assert got.status == Status.NotMyVbucket
        doc = json.loads(got.value)
        assert doc["vBucketServerMap"]["serverList"] == [f"127.0.0.1:{client_port(client)}"]
        assert client.get(b"k", vbucket=vb).status == Status.NotMyVbucket
    assert client.stats(b"vbucket")["vb_3"] == "replica"
    # back to active: served again
    client.call(Opcode.SetVbucket, vbucket=3, extras=struct.pack(">I", 1))
    assert client.set(b"k", b"v", vbucket=3).status == Status.Success


def client_port(client: KVClient) -> int:
    return client.sock.getpeername()[1]


def test_malformed_frame_closes_only_that_connection(server: ServerProcess) -> None:
    bad, good = KVClient(server.port), KVClient(server.port)
    assert good.login().status == Status.Success
    header = struct.pack(
        ">BBHBBHIIQ", Magic.ClientRequest, Opcode.Set, 300, 0, 0, 0, 300, 0xBEEF, 0
    )
    bad.send(header + b"x" * 300)
    got = bad.recv_frame()
    assert (got.status, got.opaque) == (Status.Einval, 0xBEEF)
    assert bad.closed_by_server()
    assert good.set(b"still", b"alive").status == Status.Success
    assert good.get(b"still").value == b"alive"


def test_oversize_value_is_e2big_and_not_stored(client: KVClient) -> None:
    too_big = b"x" * (20 * 1024 * 1024 + 1)
    assert client.set(b"big", too_big).status == Status.E2big
    assert client.get(b"big").status == Status.KeyEnoent


def test_stats_groups(client: KVClient) -> None:
    client.set(b"k", b"v", vbucket=2)
    general = client.stats()
    assert {"pid", "uptime", "curr_items", "mem_used", "curr_connections"} <= set(general)
    assert general["curr_items"] == "1"
    seqnos = client.stats(b"vbucket-seqno")
    for vb in range(16):
        for field in ("high_seqno", "uuid", "abs_high_seqno", "purge_seqno"):
            assert f"vb_{vb}:{field}" in seqnos
    assert seqnos["vb_2:high_seqno"] == "1"
    one = client.stats(b"vbucket-seqno 2")
    assert set(one) == {
        f"vb_2:{f}" for f in ("high_seqno", "uuid", "abs_high_seqno", "purge_seqno")
    }
    failovers = client.stats(b"failovers 2")
    assert failovers["vb_2:num_entries"] == "1"
    assert failovers["vb_2:0:id"] == seqnos["vb_2:uuid"]
    assert failovers["vb_2:0:seq"] == "0"
    assert client.call(Opcode.Stat, key=b"nonsense").status == Status.KeyEnoent


def test_mutation_seqno_extras_and_all_vb_seqnos(client: KVClient) -> None:
    assert client.hello(HelloFeature.MutationSeqno).value == b"\x00\x04"
    got = client.set(b"k", b"v", vbucket=5)
    uuid, seqno = struct.unpack(">QQ", got.extras)
    assert seqno == 1
    assert str(uuid) == client.stats(b"vbucket-seqno 5")["vb_5:uuid"]
    assert len(client.call(Opcode.Delete, key=b"k", vbucket=5).extras) == 16
    raw = client.call(Opcode.GetAllVbSeqnos).value
    pairs = dict(struct.iter_unpack(">HQ", raw))
    assert len(pairs) == 16 and pairs[5] == 2


def persisted_after(client: KVClient, vb: int, seqno: int) -> tuple[int, int]:
    """Poll ObserveSeqno until ``seqno`` is persisted: (uuid, persisted seqno)."""
    uuid = int(client.stats(b"vbucket-seqno %d" % vb)[f"vb_{vb}:uuid"])
    for _ in poll_rounds():
        fmt, vbid, got_uuid, persisted, current = struct.unpack(
            ">BHQQQ", client.observe(vb, uuid).value
        )
        assert (fmt, vbid, got_uuid) == (0, vb, uuid) and current >= seqno
        if persisted >= seqno:
            return uuid, persisted
    raise AssertionError(f"seqno {seqno} of vb {vb} never persisted")


def test_observe_seqno_shows_persistence_catching_up(client: KVClient) -> None:
    for i in range(50):
        client.set(b"o%d" % i, b"v", vbucket=7)
    _, persisted = persisted_after(client, 7, 50)
    assert persisted == 50
    assert client.observe(7, 12345).status == Status.KeyEnoent


def failover_table(client: KVClient, vb: int) -> list[tuple[str, str]]:
    stats = client.stats(b"failovers %d" % vb)
    n = int(stats[f"vb_{vb}:num_entries"])
    return [(stats[f"vb_{vb}:{i}:id"], stats[f"vb_{vb}:{i}:seq"]) for i in range(n)]


def test_clean_restart_keeps_data_and_failover_table(server: ServerProcess) -> None:
    with KVClient(server.port) as c:
        c.login()
        c.set(b"kept", b"value", vbucket=1)
        before = failover_table(c, 1)
    assert server.terminate() == 0
    assert "dcpkv stopped cleanly" in server.log()
    server.start()
    with KVClient(server.port) as c:
        c.login()
        assert c.get(b"kept", vbucket=1).value == b"value"
        assert failover_table(c, 1) == before


def test_kill9_after_persisted_keeps_write_and_branches_history(server: ServerProcess) -> None:
    with KVClient(server.port) as c:
        c.login()
        c.set(b"durable", b"yes", vbucket=6)
        old_uuid, _ = persisted_after(c, 6, 1)
        before = failover_table(c, 6)
    server.kill9()
    server.start()
    with KVClient(server.port) as c:
        c.login()
        assert c.get(b"durable", vbucket=6).value == b"yes"
        after = failover_table(c, 6)
        assert len(after) == len(before) + 1 and after[1:] == before
        assert after[0][1] == "1"  # the new branch starts at the last persisted snapshot
        # a client holding the old uuid learns of the hard failover
        fmt, vb, new_uuid, persisted, current, old, last = struct.unpack(
            ">BHQQQQQ", c.observe(6, old_uuid).value
        )
        assert (fmt, vb, old, last, persisted, current) == (1, 6, old_uuid, 1, 1, 1)
        assert str(new_uuid) == after[0][0]


def test_flush_tombstones_every_live_key(client: KVClient) -> None:
    assert client.hello(HelloFeature.MutationSeqno).status == Status.Success
    for vb in (2, 9):
        for i in range(5):
            client.set(b"f%d-%d" % (vb, i), b"v", vbucket=vb)
    client.call(Opcode.Delete, key=b"f2-0", vbucket=2)
    before = client.stats(b"vbucket-seqno")
    assert client.call(Opcode.Flush).status == Status.Success
    for vb in (2, 9):
        for i in range(5):
            assert client.get(b"f%d-%d" % (vb, i), vbucket=vb).status == Status.KeyEnoent
    after = client.stats(b"vbucket-seqno")
    # one tombstone (one seqno) per key that was live, none for the already deleted one
    assert int(after["vb_2:high_seqno"]) == int(before["vb_2:high_seqno"]) + 4
    assert int(after["vb_9:high_seqno"]) == int(before["vb_9:high_seqno"]) + 5
    assert after["vb_0:high_seqno"] == before["vb_0:high_seqno"]
    assert client.stats()["curr_items"] == "0"
    # the bucket is usable afterwards
    assert client.set(b"f2-0", b"new", vbucket=2).status == Status.Success


def test_flush_refuses_a_delay_and_a_key(client: KVClient) -> None:
    client.set(b"stays", b"v")
    delayed = client.call(Opcode.Flush, extras=struct.pack(">I", 10))
    assert delayed.status == Status.NotSupported
    assert client.call(Opcode.Flush, key=b"x").status == Status.Einval
    assert client.get(b"stays").value == b"v"
    assert client.call(Opcode.Flush, extras=struct.pack(">I", 0)).status == Status.Success
    assert client.get(b"stays").status == Status.KeyEnoent


def test_get_meta_answers_live_documents_and_tombstones(client: KVClient) -> None:
    """GetMeta (0xa0): deleted, flags, expiry and rev seqno in the extras, the CAS in the
    header; a tombstone answers too (deleted = 1), from memory and once flushed from disk."""
    cas = client.set(b"meta-doc", b"v", flags=7).cas
    got = client.call(Opcode.GetMeta, key=b"meta-doc")
    assert got.status == Status.Success and got.cas == cas
    assert struct.unpack(">IIIQ", got.extras) == (0, 7, 0, 1)
    v2 = client.call(Opcode.GetMeta, key=b"meta-doc", extras=b"\x02")
    assert len(v2.extras) == 21 and v2.cas == cas
    deleted = client.call(Opcode.Delete, key=b"meta-doc")
    uuid = int(client.stats(b"vbucket-seqno 0")["vb_0:uuid"])
    for flushed in (False, True):
        got = client.call(Opcode.GetMeta, key=b"meta-doc")
        assert got.status == Status.Success and got.cas == deleted.cas, flushed
        assert struct.unpack(">IIIQ", got.extras)[:2] == (1, 7)
        current = struct.unpack(">BHQQQ", client.observe(0, uuid).value)[4]
        persisted_after(client, 0, current)
    assert client.call(Opcode.GetMeta, key=b"never-set").status == Status.KeyEnoent
    assert client.call(Opcode.GetMeta, key=b"meta-doc", extras=b"\x03").status == Status.Einval


def test_a_sparse_backlog_gathers_until_a_client_asks_whether_it_is_persisted(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """One write is a sparse backlog: the flusher leaves it to gather for up to three flush
    intervals (engine/flush_cadence.py), but an ObserveSeqno that finds it unpersisted has it
    written at the next tick. Intervals of 2 s make the two outcomes seconds apart: the asked
    write is on disk within two ticks of the write, the bound is three intervals."""
    interval = 2.0
    srv = server_factory(tmp_path / "data", tmp_path / "server.log",
                         "--flush-interval", str(interval))  # fmt: skip
    srv.start()
    with KVClient(srv.port) as c:
        c.login()
        written_at = time.monotonic()
        assert c.set(b"sparse", b"v", vbucket=3).status == Status.Success
        for _ in poll_rounds(limit_s=3 * interval):
            stats = c.stats()
            if int(stats["ep_flushes_deferred"]) >= 1:
                break
        assert int(stats["ep_total_persisted"]) == 0, "a lone write was flushed at once"
        _, persisted = persisted_after(c, 3, 1)
        assert persisted == 1
        assert time.monotonic() - written_at < 2.75 * interval, "asking did not hurry the flush"

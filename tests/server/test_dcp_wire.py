"""DCP over real sockets against a real ``dcpkv server`` subprocess.

The consumer (:mod:`dcpclient`) is nothing but a socket, the FrameParser and decode_message;
the writer is the plain key-value test client. No assertion depends on timing: waits are
bounded loops over reads (each bounded by a socket timeout).
"""

from __future__ import annotations

import random
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol import dcp
from dcpkv.protocol.base import GenericResponse
from dcpkv.protocol.constants import (
    Magic,
    Opcode,
    OpenFlag,
    SnapshotFlag,
    StreamEndReason,
    StreamRequestFlag,
)
from dcpkv.protocol.frame import FrameParser, encode_frame
from support.dcpclient import DcpClient, VbState, all_vb_seqnos
from support.kvclient import KVClient, poll_rounds
from support.serverproc import ServerProcess

VBUCKETS = 16  # serverproc starts every server with --vbuckets 16


def vb_of(key: bytes) -> int:
    return vbucket_for_key(key, VBUCKETS)


def writer(port: int) -> KVClient:
    c = KVClient(port)
    assert c.login().status == Status.Success
    return c


def kset(c: KVClient, key: bytes, value: bytes, expiry: int = 0) -> None:
    assert c.set(key, value, vbucket=vb_of(key), expiry=expiry).status == Status.Success


def kdel(c: KVClient, key: bytes) -> None:
    c.send(c.frame(Opcode.Delete, key=key, vbucket=vb_of(key)))
    assert c.recv_frame().status in (Status.Success, Status.KeyEnoent)


def server_docs(c: KVClient, keys: set[bytes]) -> dict[bytes, bytes]:
    out = {}
    for key in keys:
        frame = c.get(key, vbucket=vb_of(key))
        if frame.status == Status.Success:
            out[key] = bytes(frame.value)
        else:
            assert frame.status == Status.KeyEnoent
    return out


def stream_all(consumer: DcpClient) -> None:
    for vb in range(VBUCKETS):
        assert isinstance(consumer.stream(vb), dcp.StreamRequestOk)


def catch_up(consumer: DcpClient) -> None:
    consumer.follow_to(all_vb_seqnos(consumer))


# -- gates ---------------------------------------------------------------------------------------


def test_gates_and_open(server: ServerProcess) -> None:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    with KVClient(server.port) as anon:
        anon.send(dcp.DcpOpen(name="x", flags=OpenFlag.Producer, opaque=1).encode())
        assert anon.recv_frame().status == Status.Eaccess
    raw.close()
    c = DcpClient(server.port, open_=False)
    # DCP before Open: Einval; GetFailoverLog is fine on any connection
    answer = c.call(dcp.StreamRequest(vbucket=0, end_seqno=10))
    assert isinstance(answer, GenericResponse) and answer.status == Status.Einval
    log = c.call(dcp.GetFailoverLog(vbucket=3))
    assert isinstance(log, dcp.GetFailoverLogResponse) and log.failover_log[0].seqno == 0
    consumer_open = c.call(dcp.DcpOpen(name="replica", flags=0))
    assert isinstance(consumer_open, GenericResponse)
    assert consumer_open.status == Status.NotSupported
    c.check(c.call(dcp.DcpOpen(name="same", flags=OpenFlag.Producer)))
    add = c.call(dcp.AddStream(vbucket=0))
    assert isinstance(add, GenericResponse) and add.status == Status.NotSupported
    assert c.control("no_such_control", "1") == Status.Einval
    # a second Open with the same name closes the first connection
    second = DcpClient(server.port, name="same")
    with pytest.raises(ConnectionError):
        c.follow(lambda: False, max_messages=10)
    stats = KVClient(server.port)
    stats.login()
    got = stats.stats(b"dcp")
    assert got["ep_dcp_producer_count"] == "1" and got["type:same"] == "producer"
    second.close()
    c.close()
    stats.close()


# -- (a) following a bucket ------------------------------------------------------------------


def test_consumer_follows_writes_deletes_expiries(server: ServerProcess) -> None:
    w = writer(server.port)
    keys = {f"doc{i}".encode() for i in range(300)}
    for key in sorted(keys):
        kset(w, key, b"v1-" + key)
    for key in sorted(keys)[::7]:
        kdel(w, key)
    # Expirations need the delete-time layout (IncludeDeleteTimes) as well as the control
    consumer = DcpClient(server.port, flags=OpenFlag.Producer | OpenFlag.IncludeDeleteTimes)
    assert consumer.control("enable_expiry_opcode", "true") == Status.Success
    stream_all(consumer)
    ttl_keys = {f"ttl{i}".encode() for i in range(20)}
    for key in sorted(ttl_keys):
        kset(w, key, b"short-lived", expiry=1)
    for key in sorted(keys)[::5]:
        kset(w, key, b"v2-" + key)
    # Wait (bounded) for the TTLs to pass: a Get of an expired key queues its expiration.
    for _ in range(100):
        if not server_docs(w, ttl_keys):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the TTL keys never expired")
    catch_up(consumer)
    everything = keys | ttl_keys
    assert consumer.docs() == server_docs(w, everything)
    expirations = [m for m in consumer.log if isinstance(m, dcp.Expiration)]
    assert {bytes(m.key) for m in expirations} == ttl_keys
    assert all(m.vbucket == vb_of(bytes(m.key)) for m in expirations)
    stats = w.stats(b"dcp")
    assert int(stats["items_sent:test:consumer"]) == sum(
        len(st.items) for st in consumer.vbs.values()
    )
    consumer.close()
    w.close()


def test_a_write_costs_the_same_with_1024_streams_open(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """The server's defaults (1024 vbuckets) and a consumer on every vbucket, as a replica or
    a Spark query holds them: the producer's stream visits per write are counted (stat
    ``stream_polls``), not timed. Before the ready queue every write visited all 1024."""
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", "--vbuckets", "1024")
    srv.start()
    w = writer(srv.port)
    consumer = DcpClient(srv.port)
    for vb in range(1024):
        assert isinstance(consumer.stream(vb), dcp.StreamRequestOk)
    polls = "stream_polls:test:consumer"
    consumer.follow_to(all_vb_seqnos(consumer))
    before = int(w.stats(b"dcp")[polls])
    keys = [b"fan-%d" % i for i in range(300)]
    for key in keys:
        vb = vbucket_for_key(key, 1024)
        assert w.set(key, b"v", vbucket=vb).status == Status.Success
    consumer.follow_to(all_vb_seqnos(consumer))
    visits = int(w.stats(b"dcp")[polls]) - before
    assert sum(len(st.items) for st in consumer.vbs.values()) == len(keys)
    assert visits <= len(keys), visits  # one visit a write at most: never the other 1023
    consumer.close()
    w.close()


# -- (b) spec 001: unpersisted writes lost in a crash --------------------------------------------


def test_crash_loses_unpersisted_writes_and_consumer_rolls_back(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    data, log = tmp_path / "crash", tmp_path / "crash.log"
    srv = server_factory(data, log)
    srv.start()
    w = writer(srv.port)
    keys = [f"key{i}".encode() for i in range(64)]
    for key in keys:
        kset(w, key, b"persisted")
    w.close()
    probe = DcpClient(srv.port, open_=False)
    persisted = all_vb_seqnos(probe)
    probe.close()
    assert srv.terminate() == 0  # clean: everything so far is on disk
    # Second life: the flusher is held back, so what follows exists only in memory.
    srv = server_factory(data, log, "--flush-interval", "3600")
    srv.start()
    w = writer(srv.port)
    for key in keys[::2]:
        kdel(w, key)
    for key in keys[::3]:
        kset(w, key, b"lost in the crash")
    consumer = DcpClient(srv.port, name="indexer:crash")
    stream_all(consumer)
    catch_up(consumer)
    assert consumer.docs() == server_docs(w, set(keys))
    before = {vb: (st.uuid, st.snapshot, st.seqno) for vb, st in consumer.vbs.items()}
    consumer.close()
    w.close()
    srv.kill9()
    srv = server_factory(data, log)
    srv.start()
    again = DcpClient(srv.port, name="indexer:crash")
    again.vbs = consumer.vbs  # the consumer's true state: uuid, snapshot, seqno
    rolled = {}
    for vb in range(VBUCKETS):
        points = again.stream_with_rollback(vb)
        if points:
            rolled[vb] = points
    # Every vbucket written in the second life had a memory snapshot past the new branch.
    written = {vb_of(k) for k in keys[::2] + keys[::3]}
    assert set(rolled) == written
    for vb in written:
        _, _, seqno = before[vb]
        # 4b: the consumer's snapshot lies past the new branch, cut at what was persisted
        assert seqno > persisted[vb] and rolled[vb] == [persisted[vb]]
    catch_up(again)
    w = writer(srv.port)
    assert again.docs() == server_docs(w, set(keys)) == dict.fromkeys(keys, b"persisted")
    again.close()
    w.close()


# -- (c) spec 000's rules through stream requests ---------------------------------------------


def test_rollback_rules_over_the_wire(server: ServerProcess) -> None:
    w = writer(server.port)
    keys = [k for k in (f"r{i}".encode() for i in range(400)) if vb_of(k) == 5][:10]
    for key in keys[:6]:
        kset(w, key, b"first branch")
    c = DcpClient(server.port)
    old_uuid = c.call(dcp.GetFailoverLog(vbucket=5)).failover_log[0].uuid  # type: ignore[attr-defined]
    watcher = DcpClient(server.port, name="watcher")
    assert isinstance(watcher.stream(5), dcp.StreamRequestOk)
    # A new branch at 6: replica then active again cuts a failover entry at the last complete
    # snapshot the vbucket persisted, so first wait for all 6 writes to be on disk.
    for _ in poll_rounds():
        persisted = struct.unpack(">BHQQQ", w.observe(5, old_uuid).value)[3]
        if persisted >= 6:
            break
    for state in (2, 1):
        frame = w.call(Opcode.SetVbucket, vbucket=5, extras=struct.pack(">I", state))
        assert frame.status == Status.Success
    watcher.follow(lambda: watcher.vbs[5].ended is not None, max_messages=100)
    assert watcher.vbs[5].ended == StreamEndReason.StateChanged
    for key in keys[6:]:
        kset(w, key, b"second branch")  # high seqno 10

    def ask(start: int, uuid: int, snap: tuple[int, int], flags: int = 0) -> int | None:
        """The rollback seqno, or None when accepted. The end is the start, so an accepted
        stream ends at once, with nothing in it."""
        answer = c.stream(5, start=start, end=start, uuid=uuid, snapshot=snap, flags=flags)
        if isinstance(answer, dcp.StreamRequestRollback):
            return answer.rollback_seqno
        assert isinstance(answer, dcp.StreamRequestOk), answer
        c.follow(lambda: c.vbs[5].ended is not None, max_messages=10)
        assert c.vbs[5].ended == StreamEndReason.OK
        return None

    assert ask(0, 0, (0, 0)) is None  # 1a
    assert ask(0, 0xDEAD, (0, 0)) is None  # 1a: without StrictVbUuid a uuid at 0 is ignored
    assert ask(0, 0xDEAD, (0, 0), StreamRequestFlag.StrictVbUuid) == 0  # 1b, then 3
    assert ask(4, 0xDEAD, (4, 4)) == 0  # 3
    assert ask(5, old_uuid, (3, 6)) is None  # 4a: snapshot ends at upper (6)
    assert ask(8, old_uuid, (7, 9)) == 6  # 4b: snapshot starts past upper
    assert ask(6, old_uuid, (4, 8)) == 4  # 4c: snapshot straddles upper
    c.close()
    watcher.close()
    w.close()


# -- (d) dedup ----------------------------------------------------------------------------------


def test_memory_snapshots_are_deduplicated(server: ServerProcess) -> None:
    w = writer(server.port)
    a, b = [k for k in (f"d{i}".encode() for i in range(400)) if vb_of(k) == 9][:2]
    consumer = DcpClient(server.port)
    assert isinstance(consumer.stream(9), dcp.StreamRequestOk)
    extras = struct.pack(">II", 0, 0)
    # One send, so all three are applied in one read, before the producer looks.
    w.send(b"".join(
        w.frame(Opcode.Set, key=k, value=v, extras=extras, vbucket=9)
        for k, v in ((a, b"1"), (b, b"2"), (a, b"3"))
    ))  # fmt: skip
    for _ in range(3):
        assert w.recv_frame().status == Status.Success
    consumer.follow_to({9: 3})
    st = consumer.vbs[9]
    (marker,) = st.markers
    assert marker.flags & SnapshotFlag.Memory and (marker.start_seqno, marker.end_seqno) == (0, 3)
    assert [(bytes(m.key), m.by_seqno) for m in st.items] == [(b, 2), (a, 3)]  # type: ignore[attr-defined]
    consumer.close()
    w.close()


# -- (e) flow control ---------------------------------------------------------------------------


def test_flow_control_on_the_wire(server: ServerProcess) -> None:
    w = writer(server.port)
    keys = [f"fc{i}".encode() for i in range(120)]
    for key in keys:
        kset(w, key, b"x" * 200)
    buffer_size = 4096
    consumer = DcpClient(server.port)
    assert consumer.control("connection_buffer_size", str(buffer_size)) == Status.Success
    stream_all(consumer)
    target = all_vb_seqnos(consumer)
    biggest = 0
    acked = 0
    consumer.sock.settimeout(0.3)
    for _ in range(10_000):
        if all(consumer.vbs[vb].seqno >= s for vb, s in target.items()):
            break
        try:
            while True:  # read until the producer stops: its window is full
                consumer.pump_one()
        except TimeoutError:
            pass
        unacked = consumer.dcp_bytes - acked
        biggest = max(biggest, unacked)
        assert unacked <= buffer_size + 24 + 31 + 16 + 200  # the window + one message
        consumer.send(dcp.BufferAck(bytes_acked=unacked))
        acked = consumer.dcp_bytes
    else:
        raise AssertionError("never caught up")
    assert biggest > buffer_size // 2  # the window was used, not trickled
    assert consumer.docs() == server_docs(w, set(keys))
    consumer.close()
    w.close()


# -- (f) noop -------------------------------------------------------------------------------------


def test_noop_sent_and_unanswered_connection_dropped(server: ServerProcess) -> None:
    consumer = DcpClient(server.port)
    assert consumer.noops == 0
    assert consumer.control("set_noop_interval", "1") == Status.Success
    assert consumer.control("enable_noop", "true") == Status.Success
    consumer.follow(lambda: consumer.noops >= 2, max_messages=10)  # answered: still alive
    consumer.answer_noops = False
    with pytest.raises(ConnectionError):
        consumer.follow(lambda: False, max_messages=10)
    assert consumer.closed and consumer.noops >= 3
    consumer.close()


# -- (g) barrier ----------------------------------------------------------------------------------


def test_barrier_echo_after_everything_before_it(server: ServerProcess) -> None:
    w = writer(server.port)
    consumer = DcpClient(server.port)
    stream_all(consumer)
    for i in range(200):
        kset(w, f"b{i}".encode(), b"v")
    high = all_vb_seqnos(consumer)
    raw = encode_frame(Magic.ClientRequest, Opcode.DcpBarrier, key=b"cookie-1", opaque=42)
    consumer.sock.sendall(raw)
    consumer.follow(lambda: bool(consumer.barriers), max_messages=10_000)
    assert consumer.barriers == [b"cookie-1"]
    assert all(consumer.vbs[vb].seqno >= s for vb, s in high.items())
    consumer.close()
    w.close()


# -- (h) concurrent writer ------------------------------------------------------------------------


def test_concurrent_writer_and_consumer_end_equal(server: ServerProcess) -> None:
    consumer = DcpClient(server.port)
    stream_all(consumer)
    keys = [f"c{i}".encode() for i in range(300)]
    errors: list[BaseException] = []

    def write() -> None:
        rng = random.Random(7)
        try:
            with writer(server.port) as w:
                for i in range(3000):
                    key = rng.choice(keys)
                    if rng.random() < 0.2:
                        kdel(w, key)
                    else:
                        kset(w, key, f"{i}".encode())
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    while thread.is_alive():
        if _readable(consumer):
            consumer.pump_one()
    thread.join()
    assert not errors
    catch_up(consumer)
    with writer(server.port) as w:
        assert consumer.docs() == server_docs(w, set(keys))
    consumer.close()


def _readable(consumer: DcpClient) -> bool:
    """A decoded message is waiting, or bytes are (waits at most 50 ms, to let the writer
    thread finish)."""
    return bool(consumer._frames or select.select([consumer.sock], [], [], 0.05)[0])


# -- dcpkv stats --------------------------------------------------------------------------------


def test_cli_stats_dcp_table(server: ServerProcess) -> None:
    import subprocess
    import sys

    consumer = DcpClient(server.port, name="indexer:cli")
    assert isinstance(consumer.stream(2), dcp.StreamRequestOk)
    cmd = [sys.executable, "-m", "dcpkv.cli.main", "stats", "dcp", "--port", str(server.port)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    rows = dict(line.split(None, 1) for line in out.splitlines())
    assert rows["ep_dcp_producer_count"] == "1"
    assert rows["num_streams:indexer:cli"] == "1"
    assert rows["start_seqno:2:indexer:cli"] == "0"
    bad = subprocess.run([*cmd, "--password", "wrong"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "AuthError" in bad.stderr
    consumer.close()


# -- takeover ----------------------------------------------------------------------------------


def test_takeover_over_the_wire(server: ServerProcess) -> None:
    w = writer(server.port)
    keys = [k for k in (f"t{i}".encode() for i in range(400)) if vb_of(k) == 3][:5]
    for key in keys:
        kset(w, key, b"moving")
    c = DcpClient(server.port, name="replica:node2")
    answer = c.stream(3, flags=StreamRequestFlag.TakeOver)
    assert isinstance(answer, dcp.StreamRequestOk)

    def next_state() -> dcp.SetVbucketState:
        before = len(c.log)
        c.follow(lambda: len(c.log) > before and isinstance(c.log[-1], dcp.SetVbucketState),
                 max_messages=100)  # fmt: skip
        msg = c.log[-1]
        assert isinstance(msg, dcp.SetVbucketState) and msg.opaque == answer.opaque
        return msg

    pending = next_state()
    assert pending.state == 3 and c.vbs[3].seqno == 5  # pending, after every item
    c.send(GenericResponse(opcode=Opcode.DcpSetVbucketState, opaque=pending.opaque))
    active = next_state()
    assert active.state == 1
    state = w.call(Opcode.GetVbucket, vbucket=3)
    assert struct.unpack(">I", state.value) == (4,)  # the old active is dead now
    assert w.set(keys[0], b"too late", vbucket=3).status == Status.NotMyVbucket
    c.send(GenericResponse(opcode=Opcode.DcpSetVbucketState, opaque=active.opaque))
    c.follow(lambda: c.vbs[3].ended is not None, max_messages=10)
    assert c.vbs[3].ended == StreamEndReason.OK
    c.close()
    w.close()


# -- rule 2 (purge) and the bucket lock ----------------------------------------------------------


def dcpkv(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "dcpkv"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)


def test_purged_tombstones_roll_a_consumer_back_to_zero(server: ServerProcess) -> None:
    w = writer(server.port)
    keys = [k for k in (f"p{i}".encode() for i in range(400)) if vb_of(k) == 3][:6]
    for key in keys:
        kset(w, key, b"v")  # seqnos 1..6
    for key in keys[:3]:
        kdel(w, key)  # tombstones at 7..9
    c = DcpClient(server.port)
    uuid = c.call(dcp.GetFailoverLog(vbucket=3)).failover_log[0].uuid  # type: ignore[attr-defined]
    c.close()
    w.close()
    assert server.terminate() == 0

    # A running server holds its bucket: compaction refuses to touch it.
    server.start()
    busy = dcpkv("compact", "--data-dir", str(server.data_dir), "--purge-before-seqno", "9")
    assert busy.returncode == 1 and "in use by another process" in busy.stderr
    assert server.terminate() == 0

    done = dcpkv("compact", "--data-dir", str(server.data_dir), "--purge-before-seqno", "9")
    assert done.returncode == 0, done.stderr
    assert "2 tombstone(s) purged" in done.stdout  # seqnos 7 and 8; 9 stays
    server.start()
    c = DcpClient(server.port)

    def ask(start: int, snap: tuple[int, int], purge: int | None = None) -> int | None:
        value = b"" if purge is None else f'{{"purge_seqno":"{purge}"}}'.encode()
        c.vbs[3] = VbState()
        answer = c.call(dcp.StreamRequest(
            vbucket=3, flags=0, start_seqno=start, end_seqno=start, vbucket_uuid=uuid,
            snap_start_seqno=snap[0], snap_end_seqno=snap[1], value=value,
        ))  # fmt: skip
        if isinstance(answer, dcp.StreamRequestRollback):
            return answer.rollback_seqno
        assert isinstance(answer, dcp.StreamRequestOk), answer
        c.follow(lambda: c.vbs[3].ended is not None, max_messages=10)
        assert c.vbs[3].ended == StreamEndReason.OK
        return None

    assert ask(6, (6, 6)) == 0  # 2: snapshot starts below the purge seqno 8
    assert ask(8, (8, 8)) is None  # at the purge seqno: nothing missed
    assert ask(6, (6, 6), purge=8) is None  # the consumer already knows of the purge
    c.close()


def test_second_server_on_the_same_data_dir_is_refused(server: ServerProcess) -> None:
    second = dcpkv("server", "--port", "0", "--data-dir", str(server.data_dir))
    assert second.returncode == 1
    assert "in use by another process" in second.stderr
    assert "Traceback" not in second.stderr


# -- backfills are read off the event loop -------------------------------------------------------


def _load_through_the_engine(data: Path, count: int) -> dict[int, int]:
    """A bucket written straight through the engine (nothing in a server's checkpoints)."""
    from dcpkv.core.vbucket import VBucketState
    from dcpkv.engine.bucket import Bucket

    with Bucket("default", data, num_vbuckets=VBUCKETS) as bucket:
        for vb in range(VBUCKETS):
            bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
        for i in range(count):
            key = b"big-%08d" % i
            bucket.get_vbucket(vb_of(key)).set(key, b"x" * 100)
        bucket.flush_once()
        return {vb: bucket.vbuckets[vb].high_seqno for vb in range(VBUCKETS)}


def _read_items_and_ends(client: DcpClient, events: list[str]) -> None:
    parser, ends = FrameParser(), 0
    while ends < VBUCKETS:
        chunk = client.sock.recv(1 << 20)
        assert chunk, "server closed the DCP connection"
        for frame in parser.feed(chunk):
            if frame.opcode == Opcode.DcpMutation:
                events.append("item")
            elif frame.opcode == Opcode.DcpStreamEnd:
                ends += 1
                events.append("end")


def test_a_get_is_answered_while_another_connection_backfills(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """A large bucket (written through the engine, so the server starts with nothing in its
    checkpoints and every stream backfills from disk) streamed by one DCP connection, read
    by a thread; meanwhile another connection's Gets are answered. Ordering, not timing: every
    Get's answer arrives before the backfill's last StreamEnd."""
    data, count = tmp_path / "data", 80_000
    highs = _load_through_the_engine(data, count)
    srv = server_factory(data, tmp_path / "server.log")
    srv.start()
    events: list[str] = []  # "item", "end", "get", appended in the order they were seen
    dcp_client = DcpClient(srv.port, "bigbackfill", timeout=60)
    for vb in range(VBUCKETS):
        dcp_client.send(dcp.StreamRequest(
            opaque=vb + 1, vbucket=vb, start_seqno=0, end_seqno=highs[vb],
        ))  # fmt: skip

    kv = writer(srv.port)
    # The reader thread parses while this one waits for answers: switch the GIL often, so
    # the test's own threads are not what orders the events.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        reader = threading.Thread(target=_read_items_and_ends, args=(dcp_client, events))
        reader.start()
        for _ in poll_rounds():
            if "item" in events:
                break  # the backfill is under way
        for i in range(5):
            key = b"big-%08d" % (i * 997)
            frame = kv.get(key, vbucket=vb_of(key))
            assert frame.status == Status.Success and bytes(frame.value) == b"x" * 100
            events.append("get")
    finally:
        sys.setswitchinterval(interval)
    reader.join(timeout=120)
    assert not reader.is_alive()
    assert events.count("item") == count and events.count("end") == VBUCKETS
    last_get = max(i for i, e in enumerate(events) if e == "get")
    last_end = max(i for i, e in enumerate(events) if e == "end")
    assert last_get < last_end, "the Gets waited for the whole backfill"
    kv.close()
    dcp_client.close()


def test_an_unanswered_noop_closes_the_connection_and_answered_ones_keep_it(
    server: ServerProcess,
) -> None:
    """Noops come one interval after the last message (not on a coarse tick): an answering
    consumer sees several; a silent one sees exactly one, then the server closes."""
    alive = DcpClient(server.port, "test:noop-alive")
    silent = DcpClient(server.port, "test:noop-silent")
    for c in (alive, silent):
        assert c.control("enable_noop", "true") == Status.Success
        assert c.control("set_noop_interval", "0.2") == Status.Success
    silent.answer_noops = False
    while alive.noops < 3:
        alive.pump_one()
    with pytest.raises(ConnectionError):
        while True:
            silent.pump_one()
    assert silent.noops == 1
    alive.close()

"""kill -9 under load: what the server said was persisted survives, and history branches.

Theory of operation
-------------------
Writer threads (one connection each, MutationSeqno negotiated) set distinct keys and record
each acknowledged write's (vbucket uuid, seqno). A poller asks ObserveSeqno for every vbucket's
persisted seqno, over and over. A write is *acknowledged as persisted* when the poller has seen
its vbucket's persisted seqno (under the same uuid) reach the write's seqno. Once enough writes
are persisted, and while the writers are still going, the server is killed with SIGKILL.

After a restart, every write acknowledged as persisted must be there with its value, and every
vbucket written to must have cut a new failover entry at its last persisted snapshot (the old
uuid second in the table), its high seqno back at that point. Loops are bounded by count and
by time; nothing asserts on how long anything took.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import HelloFeature
from support.kvclient import KVClient, poll_rounds
from support.serverproc import ServerProcess

VBUCKETS = 16  # what ServerProcess starts the server with
WRITERS = 4
WRITES_PER_WRITER = 20_000
PERSISTED_BEFORE_KILL = 500


@dataclass(frozen=True)
class Write:
    key: bytes
    value: bytes
    vb: int
    uuid: int
    seqno: int


@dataclass
class Load:
    """What the writers and the poller share (appends and dict stores are atomic)."""

    port: int
    uuids: dict[int, int]
    writes: list[Write] = field(default_factory=list)
    persisted: dict[int, int] = field(default_factory=dict)
    writers_done: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def persisted_writes(self) -> list[Write]:
        return [
            w
            for w in list(self.writes)
            if w.uuid == self.uuids[w.vb] and w.seqno <= self.persisted.get(w.vb, 0)
        ]


def writer(load: Load, n: int) -> None:
    try:
        with KVClient(load.port) as c:
            c.login()
            c.hello(HelloFeature.MutationSeqno)
            for i in range(WRITES_PER_WRITER):
                if load.stop.is_set():
                    return
                key, value = b"w%d-%d" % (n, i), b"value-%d-%d" % (n, i)
                vb = vbucket_for_key(key, VBUCKETS)
                got = c.set(key, value, vbucket=vb)
                assert got.status == Status.Success, Status(got.status)
                uuid, seqno = struct.unpack(">QQ", got.extras)
                load.writes.append(Write(key, value, vb, uuid, seqno))
    except OSError:
        pass  # the server was killed under us
    finally:
        load.writers_done += 1


def poller(load: Load) -> None:
    try:
        with KVClient(load.port) as c:
            c.login()
            while not load.stop.is_set():
                for vb, uuid in load.uuids.items():
                    _, _, _, persisted, _ = struct.unpack(">BHQQQ", c.observe(vb, uuid).value)
                    load.persisted[vb] = max(load.persisted.get(vb, 0), persisted)
    except OSError:
        pass


def failover_table(c: KVClient, vb: int) -> list[tuple[int, int]]:
    stats = c.stats(b"failovers %d" % vb)
    n = int(stats[f"vb_{vb}:num_entries"])
    return [(int(stats[f"vb_{vb}:{i}:id"]), int(stats[f"vb_{vb}:{i}:seq"])) for i in range(n)]


def test_kill9_under_load_keeps_every_write_acknowledged_as_persisted(
    server_factory: type, tmp_path: Path
) -> None:
    srv: ServerProcess = server_factory(tmp_path / "data", tmp_path / "server.log")
    srv.start()
    with KVClient(srv.port) as c:
        c.login()
        seqnos = c.stats(b"vbucket-seqno")
        tables_before = {vb: failover_table(c, vb) for vb in range(VBUCKETS)}
    load = Load(srv.port, {vb: int(seqnos[f"vb_{vb}:uuid"]) for vb in range(VBUCKETS)})
    threads = [threading.Thread(target=writer, args=(load, n)) for n in range(WRITERS)]
    threads.append(threading.Thread(target=poller, args=(load,)))
    for t in threads:
        t.start()
    try:
        for _ in poll_rounds(pause_s=0.01):
            if len(load.persisted_writes()) >= PERSISTED_BEFORE_KILL:
                break
            assert load.writers_done < WRITERS, "writers finished before enough was persisted"
        else:
            raise AssertionError("never saw enough writes persisted")
        srv.kill9()
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=30)
    durable = load.persisted_writes()
    assert len(durable) >= PERSISTED_BEFORE_KILL

    srv.start()
    with KVClient(srv.port) as c:
        c.login()
        for w in durable:
            got = c.get(w.key, vbucket=w.vb)
            assert (got.status, got.value) == (Status.Success, w.value), w
        written = {w.vb for w in load.writes}
        after = c.stats(b"vbucket-seqno")
        for vb in sorted(written):
            table = failover_table(c, vb)
            new_uuid, branch_seqno = table[0]
            assert table[1:] == tables_before[vb] and new_uuid != load.uuids[vb]
            # The branch starts at the last persisted snapshot: at least what was observed
            # persisted, and exactly where the restarted vbucket's history now ends.
            assert branch_seqno >= load.persisted.get(vb, 0)
            assert branch_seqno == int(after[f"vb_{vb}:high_seqno"])
        # Writes inside the persisted snapshot are all there, observed or not.
        for w in load.writes:
            if w.seqno <= int(after[f"vb_{w.vb}:high_seqno"]):
                assert c.get(w.key, vbucket=w.vb).value == w.value, w

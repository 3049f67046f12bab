"""The asyncio protocol shell, in process with a fake transport, and the CLI's config errors."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dcpkv.core.replication_topology import parse_topology
from dcpkv.core.seqno import U64_MAX
from dcpkv.core.status import Status
from dcpkv.dcp.producer import DcpProducer
from dcpkv.engine.hlc import SystemClock
from dcpkv.protocol import dcp, kv
from dcpkv.protocol.constants import DurabilityLevel, Magic, Opcode, OpenFlag
from dcpkv.protocol.frame import Frame, FrameParser, encode_frame
from dcpkv.server.app import DataServer, KVProtocol
from dcpkv.server.config import (
    BucketSettings,
    ConfigError,
    ServerSettings,
    load_config,
    with_cli_flags,
)
from dcpkv.server.connection import Connection
from dcpkv.server.dispatch import ROUTES, Route
from dcpkv.server.push_cadence import BATCH_ITEMS, PUMP_GAP_S, QUIET_S


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.paused = False

    def get_extra_info(self, name: str) -> object:
        return None

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


@pytest.fixture
def proto() -> KVProtocol:
    p = KVProtocol(DataServer(ServerSettings(port=0)))
    p.connection_made(FakeTransport())  # type: ignore[arg-type]
    return p


def frames(raw: bytes) -> list[Frame]:
    return list(FrameParser().feed(raw))


def req(opcode: int, opaque: int) -> bytes:
    return encode_frame(Magic.ClientRequest, opcode, opaque=opaque)


def test_one_read_is_answered_with_one_write_in_order(proto: KVProtocol) -> None:
    proto.data_received(b"".join(req(Opcode.Noop, i) for i in range(10)))
    transport = proto.transport
    assert len(transport.writes) == 1  # type: ignore[union-attr]
    got = frames(transport.writes[0])  # type: ignore[union-attr]
    assert [f.opaque for f in got] == list(range(10))


def test_a_failing_handler_answers_einternal_and_the_connection_goes_on(
    proto: KVProtocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(conn: Connection, req: kv.Flush) -> bytes:
        raise RuntimeError("bug")

    route = Route(kv.Flush.decode, broken, auth=False, bucket=False)
    monkeypatch.setitem(ROUTES, Opcode.Flush, route)
    proto.data_received(req(Opcode.Flush, 1) + req(Opcode.Noop, 2))
    got = frames(proto.transport.writes[0])  # type: ignore[union-attr]
    assert [(f.opaque, f.status) for f in got] == [(1, Status.Einternal), (2, Status.Success)]
    assert not proto.transport.closed  # type: ignore[union-attr]


def test_bad_magic_answers_einval_with_the_opaque_then_closes(proto: KVProtocol) -> None:
    bad = bytearray(req(Opcode.Noop, 77))
    bad[0] = 0x42
    proto.data_received(req(Opcode.Noop, 1) + bytes(bad))
    got = frames(b"".join(proto.transport.writes))  # type: ignore[union-attr]
    assert [(f.opaque, f.status) for f in got] == [(1, Status.Success), (77, Status.Einval)]
    assert proto.transport.closed  # type: ignore[union-attr]
    proto.data_received(req(Opcode.Noop, 3))  # ignored: the connection is closing
    assert len(proto.transport.writes) == 1  # type: ignore[union-attr]


def test_backpressure_pauses_and_resumes_reading(proto: KVProtocol) -> None:
    proto.pause_writing()
    assert proto.transport.paused  # type: ignore[union-attr]
    proto.resume_writing()
    assert not proto.transport.paused  # type: ignore[union-attr]


class CadenceRig:
    """A server's connection whose producer streams every vbucket of a 4-vbucket bucket, on
    a monotonic clock the test moves (``now[0]``); ``writes`` is what the shell sent."""

    def __init__(self, tmp_path: Path, *, sync_writes: bool = False) -> None:
        config = ServerSettings(
            port=0, data_dir=tmp_path, buckets=(BucketSettings(num_vbuckets=4),)
        )
        self.server = server = DataServer(config)
        server.open_buckets()
        self.bucket = bucket = server.state.buckets[config.buckets[0].name]
        self.now = [100.0]
        server.monotonic = lambda: self.now[0]
        self.proto = proto = KVProtocol(server)
        proto.connection_made(FakeTransport())  # type: ignore[arg-type]
        assert proto.conn is not None and isinstance(proto.transport, FakeTransport)
        self.writes = proto.transport.writes
        producer = DcpProducer(bucket, "cadence", OpenFlag.Producer, clock=SystemClock())
        if sync_writes:  # a replica's connection: it gets prepares and acknowledges them
            producer.sync_writes, producer.consumer_name = True, "replica1"
        self.producer = producer
        proto.conn.bucket_name, proto.conn.dcp = bucket.name, producer
        for vb in range(4):
            high = bucket.vbuckets[vb].high_seqno
            producer.stream_request(dcp.StreamRequest(
                opaque=vb, vbucket=vb, start_seqno=high, end_seqno=U64_MAX,
                vbucket_uuid=bucket.vbuckets[vb].uuid, snap_start_seqno=high,
                snap_end_seqno=high,
            ))  # fmt: skip

    def close(self) -> None:
        self.producer.disconnect()
        self.server._shutdown_buckets()
        self.server.executor.shutdown()


def test_a_trickle_of_writes_is_pumped_once_after_the_gap(tmp_path: Path) -> None:
    """The push cadence, wired (on a clock the test moves): the producer tells the shell of
    every write, the shell decides once per loop turn; a write after a quiet moment is pumped
    at once; writes within the gap wait and go out together in one write when it ends; a
    batch goes at once. A pump that drained everything does not come back."""
    rig = CadenceRig(tmp_path)
    bucket, now, proto, writes = rig.bucket, rig.now, rig.proto, rig.writes

    def set_one(i: int) -> None:
        bucket.vbuckets[i % 4].set(b"k%d" % i, b"v")

    async def turns() -> None:  # the loop's next few turns (callbacks run in order)
        for _ in range(3):
            await asyncio.sleep(0)

    def mutations(data: bytes) -> list[bytes]:
        return [bytes(f.key) for f in frames(data) if f.opcode == Opcode.DcpMutation]

    async def scenario() -> None:
        proto.pump()  # the streams register their cursors; the shell hooks the producer
        set_one(0)
        await turns()
        assert [mutations(w) for w in writes] == [[b"k0"]]  # Q: at once
        now[0] += QUIET_S / 2
        set_one(1)
        set_one(2)
        await asyncio.sleep(0)  # the decision, not yet the gap's end (timers come after)
        # T: waiting for the gap's end (its timer is armed, no pump scheduled)
        assert proto._pump_timer is not None and not proto._pump_scheduled and len(writes) == 1
        await asyncio.sleep(PUMP_GAP_S * 10)
        assert [mutations(w) for w in writes[1:]] == [[b"k1", b"k2"]]  # both in one write
        assert not proto._pump_scheduled  # drained: no pump comes back for nothing
        now[0] += QUIET_S / 10
        for i in range(3, 3 + BATCH_ITEMS):
            set_one(i)
        await turns()
        assert len(writes) == 3 and len(mutations(writes[2])) == BATCH_ITEMS  # B: at once

    try:
        asyncio.run(scenario())
    finally:
        rig.close()


def test_a_prepare_is_pushed_at_once_and_a_drained_pump_arms_no_timer(tmp_path: Path) -> None:
    """The push cadence's cases N and S, wired: items a pump already took arm no timer (one
    would hold the next items back), and on a connection that acknowledges prepares, a
    SyncWrite's prepare goes out at once even just after a pump, where a plain write waits
    for the gap's end."""
    rig = CadenceRig(tmp_path, sync_writes=True)
    bucket, now, proto, writes = rig.bucket, rig.now, rig.proto, rig.writes
    vbucket = bucket.vbuckets[1]
    vbucket.set_topology(parse_topology(b'{"topology": [["active", "replica1"]]}'))

    def opcodes(data: bytes) -> list[int]:
        return [f.opcode for f in frames(data) if f.opcode != Opcode.DcpSnapshotMarker]

    async def scenario() -> None:
        proto.pump()  # the streams register their cursors; the shell hooks the producer
        bucket.vbuckets[0].set(b"plain", b"v")
        proto.pump()  # as the pump after a read does: it takes the item at once
        await asyncio.sleep(0)
        assert proto._pump_timer is None and not proto._pump_scheduled  # N
        assert [opcodes(w) for w in writes] == [[Opcode.DcpMutation]]
        now[0] += QUIET_S / 10
        vbucket.sync_write(lambda: vbucket.set(b"durable", b"v"), DurabilityLevel.Majority)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert [opcodes(w) for w in writes[1:]] == [[Opcode.DcpPrepare]]  # S: at once
        now[0] += QUIET_S / 10
        bucket.vbuckets[2].set(b"trickle", b"v")  # no prepare held in its vbucket: T
        await asyncio.sleep(0)
        assert proto._pump_timer is not None and len(writes) == 2

    try:
        asyncio.run(scenario())
    finally:
        rig.close()


def test_cli_flags_override_the_first_bucket_and_the_user() -> None:
    config = with_cli_flags(
        ServerSettings(), port=0, bucket="b", vbuckets=8, user="u", password="p", host=None
    )
    assert (config.port, config.buckets[0].name, config.buckets[0].num_vbuckets) == (0, "b", 8)
    assert config.users == {"u": "p"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vbuckets", "0"], "vbuckets must be 1..1024"),
        (["--port", "70000"], "port must be 0..65535"),
        (["--config", "/nonexistent/x.toml"], "cannot read config file"),
        (["--eviction-policy", "full"], "eviction_policy must be valueOnly or fullEviction"),
    ],
)
def test_bad_settings_are_one_line_errors(args: list[str], message: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "server", "--data-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_durability_settings_from_a_config_file_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text(
        '[buckets.default]\ndurability_min_level = "majority"\ndurability_timeout_ms = 5000\n'
    )
    bucket = load_config(path).buckets[0]
    assert (bucket.min_level, bucket.durability_timeout_ms) == (DurabilityLevel.Majority, 5000)
    flagged = with_cli_flags(load_config(path), durability_min_level="none").buckets[0]
    assert flagged.min_level is None and flagged.durability_timeout_ms == 5000
    for bad in ({"durability_min_level": "all"}, {"durability_timeout_ms": 0}):
        with pytest.raises(ConfigError):
            BucketSettings(**bad)  # type: ignore[arg-type]


def test_eviction_policy_from_a_config_file_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text('[buckets.default]\neviction_policy = "fullEviction"\n')
    assert load_config(path).buckets[0].eviction_policy == "fullEviction"
    flagged = with_cli_flags(load_config(path), eviction_policy="valueOnly").buckets[0]
    assert flagged.eviction_policy == "valueOnly"
    assert BucketSettings().eviction_policy == "valueOnly"


@pytest.mark.parametrize("storage", ["sqlite", "leveldb", 1])
def test_a_storage_setting_naming_another_engine_is_a_clear_error(
    tmp_path: Path, storage: object
) -> None:
    """RocksDB is the one engine: a config file of an earlier version that says so still
    loads; one that names another engine is refused, saying what became of SQLite buckets."""
    path = tmp_path / "server.toml"
    path.write_text('[buckets.default]\nstorage = "rocksdb"\nvbuckets = 8\n')
    assert load_config(path).buckets[0].num_vbuckets == 8
    path.write_text(f"[buckets.default]\nstorage = {json.dumps(storage)}\n")
    with pytest.raises(ConfigError, match="converted to it at its first start"):
        load_config(path)
    answer = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "server", "--config", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert answer.returncode == 2 and "storage" in answer.stderr

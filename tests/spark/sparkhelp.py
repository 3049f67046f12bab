"""Shared pieces of the Spark tests: a workload, the server's truth, applying source rows."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.pipelines.mirror import read_mirror, start_mirror
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.protocol.constants import Opcode
from support.kvclient import KVClient

VBUCKETS = 8
PAST = 30 * 24 * 3600 + 1  # an absolute expiry in 1970: expired the moment it is read


@dataclass
class Workload:
    """Writes, deletes and expiries through the KV protocol; remembers every key touched."""

    port: int
    keys: set[bytes] = field(default_factory=set)

    def run(self, rounds: int, prefix: str = "k") -> None:
        with KVClient(self.port) as kv:
            assert kv.login().status == Status.Success
            for i in range(rounds):
                key = f"{prefix}-{i % 97:03d}".encode()
                self.keys.add(key)
                if i % 11 == 5:
                    kv.call(Opcode.Delete, key=key, vbucket=vb(key))
                elif i % 13 == 7:
                    kv.set(key, b"doomed-%d" % i, vbucket=vb(key), expiry=PAST)
                else:
                    kv.set(key, b"value-%d" % i, vbucket=vb(key), flags=i)

    def truth(self) -> dict[bytes, bytes]:
        """The server's live documents (a Get also expires what is due, so the expiration
        is in the change stream before the test reads it)."""
        return server_docs(self.port, self.keys)


# a server whose writes stay in memory until a clean stop (it flushes once an hour)
NO_FLUSH = ("--vbuckets", str(VBUCKETS), "--flush-interval", "3600")


def persisted_round(
    server_factory: Any, tmp_path: Path, rounds: int = 300, *, same_port: bool = False
) -> tuple[Any, Workload]:
    """A :data:`NO_FLUSH` server holding a round of ``rounds`` writes (keys ``a-*``) that a
    clean stop persisted before it started again: a kill -9 from here on rolls its vbuckets
    back to that round. ``same_port``: it comes back on the port it had."""
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", *NO_FLUSH)
    srv.start()
    work = Workload(srv.port)
    work.run(rounds, prefix="a")
    srv.terminate()  # a clean stop persists round a: the branch point of a later crash
    work.port = srv.start(same_port=True) if same_port else srv.start()
    return srv, work


def vb(key: bytes) -> int:
    return vbucket_for_key(key, VBUCKETS)


def server_docs(port: int, keys: Iterable[bytes]) -> dict[bytes, bytes]:
    out = {}
    with KVClient(port) as kv:
        assert kv.login().status == Status.Success
        for key in sorted(keys):
            frame = kv.get(key, vbucket=vb(key))
            if frame.status == Status.Success:
                out[key] = bytes(frame.value)
    return out


def high_seqnos(port: int) -> dict[int, int]:
    with KVClient(port) as kv:
        assert kv.login().status == Status.Success
        stats = kv.stats(b"vbucket-seqno")
    return {v: int(stats[f"vb_{v}:high_seqno"]) for v in range(VBUCKETS)}


class Changelog:
    """Applies the source's rows in order, per vbucket, keeping history (a rollback row drops
    the changes above its seqno, so the versions at or below it must still be there)."""

    def __init__(self) -> None:
        self.by_vb: dict[int, list[tuple[int, str, bytes, bytes | None]]] = {}
        self.rollbacks: list[tuple[int, int]] = []
        self.batch_sizes: list[int] = []

    def apply(self, rows: Iterable[Any]) -> None:
        changes = 0
        for row in rows:
            log = self.by_vb.setdefault(row.vbucket, [])
            seqno = int(row.seqno)
            if row.op == "rollback":
                self.rollbacks.append((row.vbucket, seqno))
                while log and log[-1][0] > seqno:
                    log.pop()
                continue
            changes += 1
            assert not log or log[-1][0] < seqno, "seqnos of a vbucket must ascend"
            log.append((seqno, row.op, bytes(row.key), row.value))
        self.batch_sizes.append(changes)

    def live(self) -> dict[bytes, bytes]:
        latest: dict[bytes, tuple[str, bytes | None]] = {}
        for log in self.by_vb.values():
            for _seqno, op, key, value in log:
                latest[key] = (op, value)
        return {k: bytes(v) for k, (op, v) in latest.items() if op == "mutation" and v is not None}


def stream_available_now(
    spark: Any, port: int, checkpoint: Path, log: Changelog, **options: Any
) -> None:
    """One AvailableNow run of the streaming source into ``log`` (foreachBatch on the driver)."""
    reader = spark.readStream.format("dcpkv").option("port", port)
    for name, value in options.items():
        reader = reader.option(name, value)

    def each(df: Any, _batch_id: int) -> None:
        log.apply(df.collect())

    query = (
        reader.load()
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")


def mirror_docs(spark: Any, path: Path) -> dict[bytes, bytes]:
    return {bytes(r.key): bytes(r.value) for r in read_mirror(spark, path).collect()}


def run_once(spark: Any, port: int, path: Path, **kw: Any) -> None:
    """One AvailableNow run of the mirror of the server at ``port`` into ``path``."""
    query = start_mirror(spark, SourceSettings.at(port=port), path, available_now=True, **kw)
    query.awaitTermination()
    assert query.exception() is None, query.exception()

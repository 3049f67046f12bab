"""DCP over the wire: one consumer connection streaming a bucket from a real server.

Theory of operation
-------------------
1. Load: ``--count`` items (16-byte keys, 100-byte values) are written *directly through the
   engine* (``Bucket.set`` + ``flush_once``) into a fresh data dir, then the bucket is shut
   down cleanly. That is much faster than a million pipelined Sets through the server, and
   gives exactly the on-disk state the server would have.
2. A real ``dcpkv server`` subprocess starts on that data dir. The size of the data files and
   the warm-up time (from the server's start until it listens: the interpreter's start plus
   the bucket's warm-up, which reads every document into memory) are figures too.
3. Backfill: one connection (socket + FrameParser, nothing else: counting frames is all a
   consumer must do) opens a producer and requests every vbucket from 0 to its high seqno;
   timed from the first request to the last StreamEnd.
4. Live: the same connection requests every vbucket from its high seqno to infinity, and a
   writer *process* pipelines ``--live`` Sets; timed from the writer's start until the
   consumer has received every one of them.
5. The codec's ``Mutation.encode`` rate on the same shape is printed as the local ceiling.
6. Snappy (``--snappy-docs``, 0 skips it): a second bucket of compressible JSON documents
   (~1 KB each) is backfilled three times: by a consumer that did not negotiate Snappy, by
   one that negotiated it and set ``force_value_compression`` (the server compresses every
   value as it sends it), and from a bucket that *stores* the same documents compressed (the
   passive/active modes) to a Snappy consumer (sent as stored). Bytes on the wire and items/s
   of each.

Rates are items/s and MB/s of DCP wire bytes received, plus the server process's CPU time
per item (user + system, from /proc, both of its threads): on a machine shared with other
work the wall-clock rate swings from run to run, the CPU cost per item much less. The live
line also shows snapshot markers per item (1.00: every item came in a snapshot of its own).
``--json PATH`` writes the figures for ``make bench``'s summary.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

import _placement
from _report import bench_main, rounds, window, write_json
from _server import cpu_seconds, folder_bytes
from dcpkv.client.blocking import BlockingKV
from dcpkv.core.seqno import U64_MAX
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.protocol import FrameParser, dcp, snappy
from dcpkv.protocol.constants import HelloFeature, Magic, Opcode, OpenFlag
from dcpkv.protocol.frame import Frame
from dcpkv.protocol.messages import decode_message

KEY_LEN, VALUE = 16, b"v" * 100
SNAPPY_ROUNDS = 5  # of each short figure, between yardstick samples (bench/_report.py)


def _key(i: int) -> bytes:
    return b"key-%012d" % i


def json_doc(i: int) -> bytes:
    """A compressible JSON document of about 1 KB (repeated field names and words, as real
    documents have)."""
    items = [{"sku": f"item-{i}-{n}", "name": "widget deluxe", "qty": n, "price": 9.99}
             for n in range(12)]  # fmt: skip
    return json.dumps({"id": i, "type": "order", "status": "shipped", "items": items}).encode()


Values = Callable[[int], tuple[bytes, int]]  # item number -> (value, datatype)


def load(data_dir: Path, count: int, vbuckets: int, value: Values | None = None) -> float:
    start = time.perf_counter()
    with Bucket("default", data_dir, num_vbuckets=vbuckets, memory_quota=4 << 30) as bucket:
        for vb in range(vbuckets):
            bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
        for i in range(count):
            key = _key(i)
            data, datatype = (VALUE, 0) if value is None else value(i)
            bucket.get_vbucket(bucket.vbucket_for(key)).set(key, data, datatype=datatype)
            if i % 50_000 == 49_999:
                bucket.flush_once()
    return time.perf_counter() - start


def start_server(data_dir: Path, vbuckets: int) -> tuple[subprocess.Popen[bytes], int, float]:
    port_file = data_dir.parent / "port"
    cmd = [
        sys.executable, "-m", "dcpkv.cli.main", "server", "--port", "0",
        "--data-dir", str(data_dir), "--port-file", str(port_file),
        "--vbuckets", str(vbuckets), "--memory-quota-mb", "4096",
    ]  # fmt: skip
    started = time.perf_counter()
    log = open(data_dir.parent / "server.log", "wb")  # noqa: SIM115  (lives as long as the server)
    with _placement.servers():
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    while not port_file.exists():
        if proc.poll() is not None:
            raise SystemExit(f"server exited {proc.returncode}")
        time.sleep(0.05)
    return proc, int(port_file.read_text()), time.perf_counter() - started


@contextmanager
def loaded_server(count: int, vbuckets: int, label: str, width: int = 28) -> Iterator[int]:
    """A temporary data dir loaded with ``count`` items through the engine, a server on it;
    yields its port, prints the load and warm-up times, and always stops and cleans up."""
    with loaded_server_proc(count, vbuckets, label, width) as (port, _):
        yield port


@contextmanager
def loaded_server_proc(
    count: int, vbuckets: int, label: str, width: int = 28,
    value: Values | None = None, figures: dict[str, float] | None = None,
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:  # fmt: skip
    """:func:`loaded_server`, yielding the server process too; ``figures`` (if given) gets the
    load and warm-up times and the size on disk (module docstring, steps 1-2)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"dcpkv-bench-{label}-"))
    proc = None
    try:
        data = tmp / "data"
        took = load(data, count, vbuckets, value)
        print(f"  {'load through the engine':<{width}} {took:7.2f} s")
        disk = folder_bytes(data)  # (files under it: a RocksDB bucket is a folder)
        print(f"  {'on disk':<{width}} {disk / 1e6:7.1f} MB  {disk / count:5.0f} bytes/item")
        proc, port, warm = start_server(data, vbuckets)
        print(f"  {'server start (warm-up)':<{width}} {warm:7.2f} s")
        if figures is not None:
            figures |= {"load_s": took, "disk_mb": disk / 1e6, "disk_bytes_per_item": disk / count,
                        "warmup_s": warm}  # fmt: skip
        yield port, proc
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


class Consumer:
    """One DCP producer connection; counts what arrives."""

    def __init__(self, port: int, *, snappy: bool = False, force_compression: bool = False) -> None:
        session = BlockingKV("127.0.0.1", port, timeout=120)
        if snappy:
            features = struct.pack(">HHH", HelloFeature.Datatype, HelloFeature.JSON,
                                   HelloFeature.Snappy)  # fmt: skip
            session.call(Opcode.Hello, key=b"bench", value=features)
        session.login("Administrator", "password", "default")
        # DcpOpen needs extras, which BlockingKV.call does not send: build it with the codec.
        session.sock.sendall(dcp.DcpOpen(name="bench:consumer", flags=OpenFlag.Producer).encode())
        next(iter(session.frames()))
        if force_compression:
            session.call(Opcode.DcpControl, key=b"force_value_compression", value=b"true")
        self.sock, self.parser = session.sock, session.parser
        self.uuids: dict[int, int] = {}  # from the stream requests' failover logs
        self.markers = 0  # snapshot markers received (per item: how well live items batch)

    def request_all(self, starts: dict[int, int], ends: dict[int, int] | None = None) -> None:
        """Pipelined stream requests (answers are skipped by ``run_until``)."""
        self.sock.sendall(b"".join(
            dcp.StreamRequest(
                opaque=vb, vbucket=vb, start_seqno=start,
                end_seqno=ends[vb] if ends is not None else U64_MAX,
                snap_start_seqno=start, snap_end_seqno=start, vbucket_uuid=self.uuids.get(vb, 0),
            ).encode()
            for vb, start in starts.items()
        ))  # fmt: skip

    def run_until(self, *, items: int = -1, stream_ends: int = -1) -> tuple[int, int]:
        """Read until ``items`` mutations or ``stream_ends`` StreamEnds; (items, bytes)."""
        got_items = got_ends = nbytes = 0
        while got_items != items and got_ends != stream_ends:
            data = self.sock.recv(1 << 20)
            if not data:
                raise SystemExit("server closed the connection")
            nbytes += len(data)
            for frame in self.parser.feed(data):
                if frame.magic != Magic.ClientRequest:
                    self._answer(frame)
                    continue
                if frame.opcode == Opcode.DcpMutation:
                    got_items += 1
                elif frame.opcode == Opcode.DcpSnapshotMarker:
                    self.markers += 1
                elif frame.opcode == Opcode.DcpStreamEnd:
                    got_ends += 1
        return got_items, nbytes

    def _answer(self, frame: Frame) -> None:
        if frame.opcode != Opcode.DcpStreamRequest:
            return
        answer = decode_message(frame)
        if not isinstance(answer, dcp.StreamRequestOk):
            raise SystemExit(f"stream request for vb {frame.opaque} refused: {answer}")
        self.uuids[frame.opaque] = answer.failover_log[0].uuid


def high_seqnos(port: int) -> dict[int, int]:
    with BlockingKV("127.0.0.1", port) as s:
        s.login("Administrator", "password", "default")
        frame = s.call(Opcode.GetAllVbSeqnos)
    return dict(struct.iter_unpack(">HQ", bytes(frame.value)))


def writer(port: int, count: int, vbuckets: int) -> None:
    from dcpkv.core.vbucket import vbucket_for_key
    from dcpkv.protocol.frame import encode_frame

    sock = socket.create_connection(("127.0.0.1", port))
    auth = encode_frame(Magic.ClientRequest, Opcode.SaslAuth, key=b"PLAIN",
                        value=b"\0Administrator\0password")  # fmt: skip
    sock.sendall(auth)
    sock.recv(1024)
    extras = struct.pack(">II", 0, 0)
    batch = 1000
    for base in range(0, count, batch):
        frames = []
        for i in range(base, min(count, base + batch)):
            key = b"live-%011d" % i
            frames.append(encode_frame(
                Magic.ClientRequest, Opcode.SetQ, key=key, value=VALUE, extras=extras,
                vbucket=vbucket_for_key(key, vbuckets),
            ))  # fmt: skip
        sock.sendall(b"".join(frames))
    sock.sendall(encode_frame(Magic.ClientRequest, Opcode.Noop))
    parser = FrameParser()
    while not any(f.opcode == Opcode.Noop for f in parser.feed(sock.recv(1 << 16))):
        pass
    sock.close()


def codec_rate(n: int = 200_000) -> float:
    msgs = [dcp.Mutation(key=_key(i), value=VALUE, by_seqno=i + 1, rev_seqno=1, opaque=7,
                         vbucket=i & 63) for i in range(n)]  # fmt: skip
    start = time.perf_counter()
    for m in msgs:
        m.encode()
    return n / (time.perf_counter() - start)


def _line(what: str, items: int, nbytes: int, seconds: float, cpu: float) -> str:
    return (f"  {what:<28} {items:>10,} items in {seconds:7.2f} s  "
            f"{items / seconds:>10,.0f} items/s  {nbytes / seconds / 1e6:7.1f} MB/s  "
            f"server CPU {cpu / max(items, 1) * 1e6:5.2f} us/item")  # fmt: skip


def backfill(
    port: int, proc: subprocess.Popen[bytes], what: str, **consumer: bool
) -> dict[str, float]:
    """One full backfill of the bucket by a new consumer: its figures."""
    highs = high_seqnos(port)
    c = Consumer(port, **consumer)
    start, cpu = time.perf_counter(), cpu_seconds(proc.pid)
    c.request_all(dict.fromkeys(highs, 0), highs)
    items, nbytes = c.run_until(stream_ends=len(highs))
    seconds, cpu = time.perf_counter() - start, cpu_seconds(proc.pid) - cpu
    c.sock.close()
    print(_line(what, items, nbytes, seconds, cpu) + f"  {nbytes / 1e6:8.1f} MB on the wire")
    return {"items_per_s": items / seconds, "wire_mb": nbytes / 1e6,
            "server_cpu_us_per_item": cpu / max(items, 1) * 1e6}  # fmt: skip


def snappy_phase(count: int, vbuckets: int) -> dict[str, float]:
    """Backfills of compressible JSON with and without Snappy (module docstring, step 6)."""
    size = len(json_doc(0))
    print(f"Snappy: {count:,} JSON documents of ~{size} bytes "
          f"(Snappy block ~{len(snappy.deflate(json_doc(0)))} bytes)")  # fmt: skip
    figures: dict[str, float] = {}
    plain = lambda i: (json_doc(i), 0x01)  # noqa: E731
    with loaded_server_proc(count, vbuckets, "snappy", value=plain) as (port, proc):
        for name, what, opts in (
            ("plain", "backfill, no Snappy", {}),
            ("forced", "backfill, force_compression", {"snappy": True, "force_compression": True}),
        ):
            figures |= _backfills(f"snappy_{name}", port, proc, what, **opts)
    packed = lambda i: (snappy.deflate(json_doc(i)), 0x03)  # noqa: E731
    with loaded_server_proc(count, vbuckets, "snappy-stored", value=packed) as (port, proc):
        figures |= _backfills("snappy_stored", port, proc, "backfill, stored compressed",
                              snappy=True)  # fmt: skip
    return figures


def _backfills(
    prefix: str, port: int, proc: subprocess.Popen[bytes], what: str, **consumer: bool
) -> dict[str, float]:
    """SNAPPY_ROUNDS backfills, each between yardstick samples (a backfill of the Snappy
    phase's documents lasts about a second: one alone is at the mercy of the host)."""

    def one() -> dict[str, float]:
        return {f"{prefix}_{k}": v for k, v in backfill(port, proc, what, **consumer).items()}

    return rounds(SNAPPY_ROUNDS, one)


def main(
    count: int = typer.Option(1_000_000, "--count", help="items loaded before streaming"),
    live: int = typer.Option(100_000, "--live", help="items written during the live phase"),
    vbuckets: int = typer.Option(64, "--vbuckets", help="vbuckets of the bucket"),
    snappy_docs: int = typer.Option(
        200_000, "--snappy-docs", help="JSON documents for the Snappy backfills (0: skip)"
    ),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    figures: dict[str, float] = {}
    print(f"DCP bench: {count:,} items of {len(VALUE)} bytes, {vbuckets} vbuckets")
    with loaded_server_proc(count, vbuckets, "dcp", figures=figures) as (port, proc):
        highs = high_seqnos(port)
        consumer = Consumer(port)
        with window("backfill_items_per_s", "backfill_mb_per_s"):
            start, cpu = time.perf_counter(), cpu_seconds(proc.pid)
            # every vbucket from 0 to its high seqno: one StreamEnd each at the end
            consumer.request_all(dict.fromkeys(highs, 0), highs)
            items, nbytes = consumer.run_until(stream_ends=len(highs))
            seconds, cpu = time.perf_counter() - start, cpu_seconds(proc.pid) - cpu
        print(_line("backfill, one connection", items, nbytes, seconds, cpu))
        figures |= {"backfill_items": items, "backfill_items_per_s": items / seconds,
                    "backfill_mb_per_s": nbytes / seconds / 1e6,
                    "backfill_server_cpu_us_per_item": cpu / max(items, 1) * 1e6}  # fmt: skip
        consumer.request_all(highs)
        consumer.markers = 0
        writer_proc = multiprocessing.Process(target=writer, args=(port, live, vbuckets))
        with window("live_items_per_s", "live_mb_per_s"):
            start, cpu = time.perf_counter(), cpu_seconds(proc.pid)
            writer_proc.start()
            items, nbytes = consumer.run_until(items=live)
            seconds, cpu = time.perf_counter() - start, cpu_seconds(proc.pid) - cpu
        writer_proc.join()
        markers = consumer.markers / max(items, 1)
        print(
            _line("live, concurrent writer", items, nbytes, seconds, cpu)
            + f"  {markers:.2f} markers/item"
        )
        figures |= {"live_items": items, "live_items_per_s": items / seconds,
                    "live_markers_per_item": markers,
                    "live_mb_per_s": nbytes / seconds / 1e6,
                    "live_server_cpu_us_per_item": cpu / max(items, 1) * 1e6}  # fmt: skip
        rate = rounds(SNAPPY_ROUNDS, lambda: {"codec_encode_items_per_s": codec_rate()})[
            "codec_encode_items_per_s"
        ]
        wire = len(dcp.Mutation(key=_key(0), value=VALUE).encode())
        print(f"  codec Mutation.encode (ceiling)                    {rate:>10,.0f} items/s  "
              f"{rate * wire / 1e6:7.1f} MB/s")  # fmt: skip
        figures["codec_encode_items_per_s"] = rate
    if snappy_docs:
        figures |= snappy_phase(snappy_docs, vbuckets)
    write_json(json_out, "dcp", figures)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    bench_main(main)

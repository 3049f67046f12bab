"""Live tail latency: write acknowledged -> DCP mutation received, with a paced writer.

Theory of operation
-------------------
Per offered rate (``--rates``, 10k and 50k writes/s) a fresh ``dcpkv server`` (1024 vbuckets)
and three processes:

* a **consumer** process: one raw socket (``FrameParser`` from the codec, nothing else),
  SASL, DcpOpen, then a stream on every vbucket from its high seqno to infinity; once every
  stream request is answered it tells the parent, then reads. Each ``recv`` is stamped with
  ``time.perf_counter()`` and every DcpMutation key in it gets that stamp;
* a **writer** process: pipelined plain Sets (no MutationSeqno feature, so 24-byte answers),
  paced the way ``peerbench/redis_streams.py`` paces its tail writer: batch ``k`` is due at
  ``t0 + k * batch / rate``, with one batch every millisecond (``rate / 1000`` Sets), a late
  batch goes out at once, so the schedule never drifts. Between batches the writer waits in
  ``select`` on its socket and stamps each ``recv`` of answers; a Set's acknowledgement time
  is the stamp of the read that brought its answer (matched by opaque). So that a server
  slower than the offered rate cannot deadlock the two socket buffers, at most 100 ms of
  writes are unanswered at once; the achieved rate shows when that bound held the writer back;
* the parent, which starts both, stops the writer after ``--seconds``, lets the consumer
  drain, and matches receipts to writes **by key**.

The server's cost of each paced load is a figure too: its CPU (all threads) and the bytes it
had written to disk (``/proc/PID/io``), per write, from the writer's start until half a
second after it stopped. At 1,024 vbuckets a paced load is wide and light, the flusher's
worst case (``engine/flush_cadence.py``).

``perf_counter`` is CLOCK_MONOTONIC, one clock for every process on Linux, so stamps of
different processes subtract. Two latencies per write: acknowledged -> received (the issue's
figure; it can be slightly negative, as the server may send the mutation before the writer
reads its answer) and sent -> received (what the Redis peer measures: its writer stamps a
batch as it sends it). p50/p99/p999 in ms, the achieved write rate and how many were received.

The peer: when ``redis-server`` is on PATH and a Python with ``redis`` and ``hiredis`` is
found, ``peerbench/redis_streams.py``'s own paced tail (``bench_tail``) runs at the same rates
and batch size in the same run (``bench/_redis_tail.py``), so the ratio compares one moment of
this shared machine. ``--json PATH`` writes the figures for ``make bench``'s summary.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import shutil
import socket
import struct
import subprocess
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Annotated

import typer

from _peers import PEERBENCH, peer_python
from _report import bench_main, write_json
from _server import bench_server_proc, cpu_seconds, disk_bytes_written
from dcpkv.core.seqno import U64_MAX
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol import dcp
from dcpkv.protocol.constants import Magic, Opcode, OpenFlag
from dcpkv.protocol.frame import FrameParser, encode_frame

VBUCKETS = 1024
VALUE = b"v" * 100
_SET_EXTRAS = struct.pack(">II", 0, 0)
_AUTH = encode_frame(Magic.ClientRequest, Opcode.SaslAuth, key=b"PLAIN",
                     value=b"\0Administrator\0password")  # fmt: skip
BATCH_EVERY_S = 0.001  # one batch per millisecond, as the Redis peer paces
MAX_UNANSWERED_S = 0.1  # at most this much of the offered rate in flight
DRAIN_IDLE_S = 10.0  # the consumer gives up after this long without a mutation
SETTLE_S = 0.5  # after the writer stops, before the cost is read: the last backlog is on disk


def key_of(i: int) -> bytes:
    return b"lat-%012d" % i  # 16 bytes


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_answers(sock: socket.socket, parser: FrameParser, count: int) -> list[int]:
    statuses: list[int] = []
    while len(statuses) < count:
        statuses += [f.status for f in parser.feed(sock.recv(1 << 16))]
    return statuses


# -- consumer ------------------------------------------------------------------------------------


def consumer(
    port: int, ready: Connection, results: Connection, uuids: dict[int, int] | None = None
) -> None:
    """Stream every vbucket from its high seqno; send back [(recv stamp, [keys])]. A server
    that already holds data needs each vbucket's uuid (``uuids``) to accept such a start."""
    sock = _connect(port)
    parser = FrameParser()
    streams = _request_streams(sock, parser, uuids or {})
    answers, stamps = 0, []
    sock.settimeout(0.2)
    idle_since = time.perf_counter()
    expected = -1  # how many writes the writer made: the parent tells us when it knows
    received = 0
    while expected < 0 or received < expected:
        if expected < 0 and results.poll():
            expected = results.recv()
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            if expected >= 0 and time.perf_counter() - idle_since > DRAIN_IDLE_S:
                break
            continue
        now = time.perf_counter()
        if not data:
            break
        keys, answered = _mutation_keys(parser, data)
        answers += answered
        if answered and answers == streams:
            ready.send(True)
        if keys:
            stamps.append((now, keys))
            received += len(keys)
            idle_since = now
    sock.close()
    results.send(stamps)


def _request_streams(sock: socket.socket, parser: FrameParser, uuids: dict[int, int]) -> int:
    """Log in, open a producer, request every vbucket from its high seqno; how many."""
    sock.sendall(_AUTH + encode_frame(Magic.ClientRequest, Opcode.GetAllVbSeqnos))
    frames: list = []
    while len(frames) < 2:
        frames += list(parser.feed(sock.recv(1 << 20)))
    highs = dict(struct.iter_unpack(">HQ", bytes(frames[1].value)))
    sock.sendall(dcp.DcpOpen(name="bench:latency", flags=OpenFlag.Producer).encode())
    _read_answers(sock, parser, 1)
    sock.sendall(b"".join(
        dcp.StreamRequest(opaque=vb, vbucket=vb, start_seqno=high, end_seqno=U64_MAX,
                          snap_start_seqno=high, snap_end_seqno=high,
                          vbucket_uuid=uuids.get(vb, 0)).encode()
        for vb, high in highs.items()
    ))  # fmt: skip
    return len(highs)


def _mutation_keys(parser: FrameParser, data: bytes) -> tuple[list[bytes], int]:
    """The keys of the DcpMutations in ``data``, and how many stream requests it answered."""
    keys, answered = [], 0
    for frame in parser.feed(data):
        if frame.opcode == Opcode.DcpMutation:
            keys.append(bytes(frame.key))
        elif frame.opcode == Opcode.DcpStreamRequest and frame.magic == Magic.ClientResponse:
            if frame.status != Status.Success:
                raise SystemExit(f"stream request refused: 0x{frame.status:02x}")
            answered += 1
    return keys, answered


# -- writer --------------------------------------------------------------------------------------


def writer(port: int, rate: int, seconds: float, results: Connection) -> None:
    """Paced pipelined Sets for ``seconds``; send back (sent stamps, ack stamps)."""
    sock = _connect(port)
    parser = FrameParser()
    sock.sendall(_AUTH)
    _read_answers(sock, parser, 1)
    batch = max(1, round(rate * BATCH_EVERY_S))
    max_unanswered = max(batch, int(rate * MAX_UNANSWERED_S))
    sent: list[float] = []
    acked: list[float] = []
    t0 = time.perf_counter()
    deadline = t0 + seconds
    k = 0
    while time.perf_counter() < deadline:
        due = t0 + k * batch / rate
        if len(sent) - len(acked) + batch > max_unanswered:
            due = float("inf")  # too much in flight: only read until answers make room
        wait = min(due, deadline) - time.perf_counter()
        if wait > 0:
            _read_ready(sock, parser, acked, wait)
            continue
        first = len(sent)
        payload = b"".join(
            encode_frame(Magic.ClientRequest, Opcode.Set, key=key_of(i), value=VALUE,
                         extras=_SET_EXTRAS, vbucket=vbucket_for_key(key_of(i), VBUCKETS),
                         opaque=i)
            for i in range(first, first + batch)
        )  # fmt: skip
        stamp = time.perf_counter()
        sock.sendall(payload)
        sent += [stamp] * batch
        k += 1
    elapsed = time.perf_counter() - t0
    while len(acked) < len(sent):
        _read_ready(sock, parser, acked, 1.0)
    sock.close()
    results.send((sent, acked, elapsed))


def _read_ready(sock: socket.socket, parser: FrameParser, acked: list[float], wait: float) -> None:
    """Read the answers that arrive within ``wait`` seconds; stamp each read."""
    readable, _, _ = select.select([sock], [], [], wait)
    if not readable:
        return
    data = sock.recv(1 << 20)
    now = time.perf_counter()
    for frame in parser.feed(data):
        if frame.status != Status.Success:
            raise SystemExit(f"Set answered 0x{frame.status:02x}")
        # answers come in request order on one connection, so the opaque is len(acked)
        if frame.opaque != len(acked):
            raise SystemExit(f"answer {frame.opaque} out of order (expected {len(acked)})")
        acked.append(now)


# -- one rate ------------------------------------------------------------------------------------


def _quantile_ms(sorted_s: list[float], q: float) -> float:
    if not sorted_s:
        return float("nan")
    return sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))] * 1e3


def paced_tail(
    write_port: int,
    read_port: int,
    rate: int,
    seconds: float,
    uuids: dict[int, int] | None = None,
) -> tuple[list[float], list[float], float, dict[int, float]]:
    """The writer paced into ``write_port`` while the consumer streams ``read_port`` (the same
    node, or a replica of it): (sent stamps, ack stamps, elapsed, write index -> received)."""
    ctx = multiprocessing.get_context("fork")
    ready_r, ready_w = ctx.Pipe(duplex=False)
    cons_parent, cons_child = ctx.Pipe()
    cons = ctx.Process(target=consumer, args=(read_port, ready_w, cons_child, uuids), daemon=True)
    cons.start()
    ready_w.close()  # the parent keeps only its own ends: a dead child then reads as EOF
    cons_child.close()
    if not ready_r.poll(120):
        cons.kill()
        raise SystemExit("the consumer's stream requests were not all answered")
    write_r, write_w = ctx.Pipe(duplex=False)
    wproc = ctx.Process(target=writer, args=(write_port, rate, seconds, write_w), daemon=True)
    wproc.start()
    write_w.close()
    sent, acked, elapsed = write_r.recv()
    wproc.join()
    cons_parent.send(len(sent))
    stamps = cons_parent.recv()
    cons.join()
    received = {int(key[4:]): at for at, keys in stamps for key in keys if key.startswith(b"lat-")}
    return sent, acked, elapsed, received


def measure(rate: int, seconds: float) -> dict[str, float]:
    with bench_server_proc(VBUCKETS, label="latency") as (port, pid):
        disk, cpu = disk_bytes_written(pid), cpu_seconds(pid)
        sent, acked, elapsed, received = paced_tail(port, port, rate, seconds)
        time.sleep(SETTLE_S)  # the last sparse backlog reaches the disk
        disk, cpu = disk_bytes_written(pid) - disk, cpu_seconds(pid) - cpu
    ack_lat = sorted(at - acked[i] for i, at in received.items())
    sent_lat = sorted(at - sent[i] for i, at in received.items())
    out = {
        "offered_writes_per_s": rate,
        "achieved_writes_per_s": len(sent) / elapsed,
        "writes": len(sent),
        "received": len(received),
        # the server's cost of the paced load (DCP to one consumer included): disk bytes and
        # CPU per write, from /proc (the flusher's cadence shows here: engine/flush_cadence.py)
        "server_disk_kb_per_write": disk / 1000 / max(1, len(sent)),
        "server_cpu_us_per_write": cpu * 1e6 / max(1, len(sent)),
    }
    for name, lat in (("ack", ack_lat), ("sent", sent_lat)):
        for q, label in ((0.5, "p50"), (0.99, "p99"), (0.999, "p999")):
            out[f"{name}_{label}_ms"] = _quantile_ms(lat, q)
    return out


# -- the Redis peer ------------------------------------------------------------------------------


def redis_peer(rates: list[int], seconds: float) -> dict[int, dict[str, float]] | None:
    if shutil.which("redis-server") is None or not (PEERBENCH / "redis_streams.py").exists():
        print("  redis-server not on PATH (or no peerbench): no peer figure")
        return None
    exe = peer_python()
    if exe is None:
        print("  no Python with redis and hiredis (peerbench/install.sh): no peer figure")
        return None
    script = Path(__file__).with_name("_redis_tail.py")
    args = [exe, str(script), str(PEERBENCH), str(seconds), *map(str, rates)]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return {int(k): v for k, v in json.loads(done.stdout).items()}


# -- main ----------------------------------------------------------------------------------------


def main(
    rates: str = typer.Option("10000,50000", help="offered write rates, writes/s, comma-separated"),
    seconds: float = typer.Option(5.0, help="seconds of writing per rate"),
    peer: bool = typer.Option(True, help="also run the Redis peer's paced tail when on PATH"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    offered = [int(r) for r in rates.split(",")]
    print(f"live tail latency: paced writer (a batch every 1 ms), 1 DCP connection, "
          f"{VBUCKETS} streams, {seconds:.0f} s per rate")  # fmt: skip
    figures: dict[str, float] = {}
    phases: dict[str, dict[str, float]] = {}
    for rate in offered:
        r = measure(rate, seconds)
        phases[f"dcpkv_{rate}"] = r
        print(
            f"  dcpkv {rate:>7,}/s offered: {r['achieved_writes_per_s']:>9,.0f}/s achieved, "
            f"{r['received']:,}/{r['writes']:,} received; ack->received p50 "
            f"{r['ack_p50_ms']:.2f} p99 {r['ack_p99_ms']:.2f} p999 {r['ack_p999_ms']:.2f} ms; "
            f"sent->received p50 {r['sent_p50_ms']:.2f} p99 {r['sent_p99_ms']:.2f} ms; "
            f"server {r['server_cpu_us_per_write']:.1f} us CPU, "
            f"{r['server_disk_kb_per_write']:.2f} kB to disk per write"
        )
        tag = f"{rate // 1000}k"
        figures |= {
            f"achieved_writes_per_s_{tag}": r["achieved_writes_per_s"],
            f"received_fraction_{tag}": r["received"] / max(1, r["writes"]),
            f"server_cpu_us_per_write_{tag}": r["server_cpu_us_per_write"],
            f"server_disk_kb_per_write_{tag}": r["server_disk_kb_per_write"],
        }
        for name in ("ack", "sent"):
            for label in ("p50", "p99", "p999"):
                figures[f"{name}_{label}_ms_{tag}"] = r[f"{name}_{label}_ms"]
    peers = redis_peer(offered, seconds) if peer else None
    for rate, r in (peers or {}).items():
        phases[f"redis_{rate}"] = r
        print(f"  redis {rate:>7,}/s offered: {r['rate']:>9,.0f}/s achieved; sent->received p50 "
              f"{r['p50_us'] / 1e3:.2f} p99 {r['p99_us'] / 1e3:.2f} ms")  # fmt: skip
    redis = {
        f"sent_{q}_ms_{rate // 1000}k": r[f"{q}_us"] / 1e3
        for rate, r in (peers or {}).items()
        for q in ("p50", "p99")
    }
    write_json(json_out, "latency", figures, phases=phases, peer={"redis": redis})


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    bench_main(main)

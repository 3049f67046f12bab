"""The two DCP fan-out defects of the server-speed issue, as a user meets them.

Theory of operation
-------------------
A fresh ``dcpkv server`` (1024 vbuckets, the default flush interval) is driven the way a plain
memcached client drives it: ONE connection, one Set at a time (send, wait for the answer).
Each phase writes for ``--seconds``:

1. **alone**: nobody streams;
2. **streamed**: a consumer *process* holds one DCP connection with a stream on every vbucket
   (from 0 to infinity, as a replica or a Spark query does) and reads everything it is sent;
3. **loaded**: as 2, plus a background writer process that pipelines SetQs as fast as the
   server takes them (batches of 100), so the event loop is saturated: the flusher must still
   get its share.

Per phase the writer's Set rate and the time from a Set's answer to the moment ObserveSeqno
reports it persisted (sampled every ``--sample``-th write, polled on a second connection every
millisecond) are reported. The defects: a write whose cost grows with the open streams makes
phase 2's rate collapse; a flusher starved by the event loop makes persistence lag by seconds.
Targets (the issue): streamed rate >= 0.8x alone; persisted p50 <= 0.5 s, max <= 2 s.

Then the **round trip** of that one-Set-at-a-time writer (issue 36: a consumer's producer must
not make the front end wait): two fresh servers side by side, one alone and one whose 1,024
vbuckets a consumer process streams (it opens them before any write, so it has nothing to
backfill, then drains its socket without parsing: its CPU is its own, not the server's); one
connection to each takes turns of ``--slice`` seconds for ``--rounds`` rounds, so both
figures come from the same moments of this shared host. Per server: Sets/s over its turns,
and the p50 and p99 of a Set's round trip (send to answer parsed), nothing else sent between.
Targets: Sets/s with the streams >= 0.8x without, p99 with <= 2x without.

``--json PATH`` writes the figures for ``make bench``'s summary.
"""

from __future__ import annotations

import multiprocessing
import socket
import struct
import threading
import time
from collections import deque
from pathlib import Path
from statistics import quantiles
from typing import Annotated

import typer

from _report import bench_main, window, write_json

# bench/ is on sys.path: the script's own folder
from _server import bench_server, bench_server_proc
from dcpkv.core.seqno import U64_MAX
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol import dcp
from dcpkv.protocol.constants import HelloFeature, Magic, Opcode, OpenFlag
from dcpkv.protocol.frame import FrameParser, encode_frame

VBUCKETS = 1024
VALUE = b"v" * 100
_SET_EXTRAS = struct.pack(">II", 0, 0)
_TOKEN = struct.Struct(">QQ")
_OBSERVE = struct.Struct(">BHQQQ")


class Client:
    """A blocking connection that sends one request and reads its answer."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser()
        self.call(Opcode.SaslAuth, key=b"PLAIN", value=b"\0Administrator\0password")
        features = struct.pack(">H", HelloFeature.MutationSeqno)
        self.call(Opcode.Hello, key=b"bench", value=features)

    def call(self, opcode: int, **kw: object) -> tuple[int, bytes, bytes]:
        self.sock.sendall(encode_frame(Magic.ClientRequest, opcode, **kw))  # type: ignore[arg-type]
        while True:
            frames = list(self.parser.feed(self.sock.recv(65536)))
            if frames:
                f = frames[-1]
                return f.status, bytes(f.extras), bytes(f.value)


def write_phase(port: int, seconds: float, sample: int, tag: str) -> dict[str, float]:
    """Sets for ``seconds``; every ``sample``-th is timed until ObserveSeqno says persisted."""
    writer = Client(port)
    poller = Client(port)
    waiting: deque[tuple[float, int, int, int]] = deque()  # (acked at, vb, uuid, seqno)
    latencies: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not (stop.is_set() and not waiting):
            if not waiting:
                time.sleep(0.001)
                continue
            acked, vb, uuid, seqno = waiting[0]
            _, _, value = poller.call(
                Opcode.ObserveSeqno, vbucket=vb, value=struct.pack(">Q", uuid)
            )
            persisted = _OBSERVE.unpack_from(value)[3]
            if persisted >= seqno:
                latencies.append(time.perf_counter() - acked)
                waiting.popleft()
            else:
                time.sleep(0.001)

    polling = threading.Thread(target=poll, daemon=True)
    polling.start()
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        key = b"%s-%010d" % (tag.encode(), n)
        vb = vbucket_for_key(key, VBUCKETS)
        status, extras, _ = writer.call(
            Opcode.Set, key=key, value=VALUE, extras=_SET_EXTRAS, vbucket=vb
        )
        if status != Status.Success:
            raise SystemExit(f"Set answered 0x{status:02x}")
        if n % sample == 0:
            uuid, seqno = _TOKEN.unpack(extras)
            waiting.append((time.perf_counter(), vb, uuid, seqno))
        n += 1
    elapsed = time.perf_counter() - start
    stop.set()
    polling.join(timeout=120)
    if waiting:
        raise SystemExit(f"{len(waiting)} sampled writes not persisted after 120 s")
    cuts = quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {
        "sets": n,
        "rate": n / elapsed,
        "persist_p50_s": cuts[49],
        "persist_p99_s": cuts[98],
        "persist_max_s": max(latencies),
    }


def consume(port: int, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    """A DCP connection streaming every vbucket from 0 to infinity, reading everything."""
    sock = socket.create_connection(("127.0.0.1", port))
    auth = encode_frame(Magic.ClientRequest, Opcode.SaslAuth, key=b"PLAIN",
                        value=b"\0Administrator\0password")  # fmt: skip
    sock.sendall(auth + dcp.DcpOpen(name="bench:fanout", flags=OpenFlag.Producer).encode())
    requests = b"".join(
        dcp.StreamRequest(opaque=vb, vbucket=vb, start_seqno=0, end_seqno=U64_MAX).encode()
        for vb in range(VBUCKETS)
    )
    sock.sendall(requests)
    parser, answers = FrameParser(), 0
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return
        for frame in parser.feed(data):
            if frame.opcode == Opcode.DcpStreamRequest and frame.magic == Magic.ClientResponse:
                if frame.status != Status.Success:
                    raise SystemExit(f"stream request refused: 0x{frame.status:02x}")
                answers += 1
                if answers == VBUCKETS:
                    ready.set()


def drain(port: int, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    """:func:`consume`'s streams, from each vbucket's start (call it before any write), then
    the bytes are read and dropped: the round-trip row charges the server alone."""
    sock = socket.create_connection(("127.0.0.1", port))
    auth = encode_frame(Magic.ClientRequest, Opcode.SaslAuth, key=b"PLAIN",
                        value=b"\0Administrator\0password")  # fmt: skip
    sock.sendall(auth + dcp.DcpOpen(name="bench:fanout-rtt", flags=OpenFlag.Producer).encode())
    sock.sendall(b"".join(
        dcp.StreamRequest(opaque=vb, vbucket=vb, start_seqno=0, end_seqno=U64_MAX).encode()
        for vb in range(VBUCKETS)
    ))  # fmt: skip
    parser, answers = FrameParser(), 0
    while answers < VBUCKETS:
        for frame in parser.feed(sock.recv(1 << 20)):
            if frame.opcode == Opcode.DcpStreamRequest and frame.magic == Magic.ClientResponse:
                if frame.status != Status.Success:
                    raise SystemExit(f"stream request refused: 0x{frame.status:02x}")
                answers += 1
    ready.set()
    while sock.recv(1 << 20):
        pass


def set_turn(writer: Client, seconds: float, tag: str, first: int, rtts: list[float]) -> int:
    """One Set at a time for ``seconds``, each round trip appended to ``rtts``; the next key
    number."""
    n, deadline = first, time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        if start >= deadline:
            return n
        key = b"%s-%010d" % (tag.encode(), n)
        status, _, _ = writer.call(
            Opcode.Set,
            key=key,
            value=VALUE,
            extras=_SET_EXTRAS,
            vbucket=vbucket_for_key(key, VBUCKETS),
        )
        rtts.append(time.perf_counter() - start)
        if status != Status.Success:
            raise SystemExit(f"Set answered 0x{status:02x}")
        n += 1


def round_trips(rounds: int, slice_s: float) -> dict[str, dict[str, float]]:
    """The round-trip row (module docstring): per server, Sets/s and p50/p99 in us."""
    with bench_server_proc(VBUCKETS, label="fanout-alone") as (alone_port, _), \
            bench_server_proc(VBUCKETS, label="fanout-rtt") as (streamed_port, _):  # fmt: skip
        ready = multiprocessing.Event()
        consumer = multiprocessing.Process(target=drain, args=(streamed_port, ready), daemon=True)
        consumer.start()
        try:
            if not ready.wait(60):
                raise SystemExit("the consumer's 1024 stream requests were not all answered")
            writers = {"alone": Client(alone_port), "streamed": Client(streamed_port)}
            for name, w in writers.items():  # warm both (the first Sets build the hash tables)
                set_turn(w, slice_s, f"warm-{name}", 0, [])
            rtts: dict[str, list[float]] = {name: [] for name in writers}
            spent = dict.fromkeys(writers, 0.0)
            keys = dict.fromkeys(writers, 0)
            for _ in range(rounds):
                for name, w in writers.items():
                    start = time.perf_counter()
                    keys[name] = set_turn(w, slice_s, f"rtt-{name}", keys[name], rtts[name])
                    spent[name] += time.perf_counter() - start
        finally:
            consumer.kill()
    out = {}
    for name, samples in rtts.items():
        cuts = quantiles(samples, n=100)
        out[name] = {"sets": len(samples), "rate": len(samples) / spent[name],
                     "p50_us": cuts[49] * 1e6, "p99_us": cuts[98] * 1e6}  # fmt: skip
    return out


def hammer(port: int) -> None:
    """Pipelined SetQ batches, flat out, until killed (the background load of phase 3)."""
    sock = socket.create_connection(("127.0.0.1", port))
    auth = encode_frame(Magic.ClientRequest, Opcode.SaslAuth, key=b"PLAIN",
                        value=b"\0Administrator\0password")  # fmt: skip
    sock.sendall(auth)
    sock.recv(4096)
    noop = encode_frame(Magic.ClientRequest, Opcode.Noop)
    parser, n = FrameParser(), 0
    while True:
        frames = []
        for _ in range(100):
            key = b"load-%011d" % (n % 200_000)
            vb = vbucket_for_key(key, VBUCKETS)
            frames.append(encode_frame(Magic.ClientRequest, Opcode.SetQ, key=key, value=VALUE,
                                       extras=_SET_EXTRAS, vbucket=vb))  # fmt: skip
            n += 1
        sock.sendall(b"".join(frames) + noop)
        while not any(f.opcode == Opcode.Noop for f in parser.feed(sock.recv(1 << 16))):
            pass


def main(
    seconds: float = typer.Option(5.0, help="seconds of writing per phase"),
    sample: int = typer.Option(20, help="time every N-th write until persisted"),
    rounds: int = typer.Option(24, help="round-trip row: turns per server"),
    slice_s: float = typer.Option(0.25, "--slice", help="round-trip row: seconds per turn"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    results: dict[str, dict[str, float]] = {}
    with bench_server(VBUCKETS, label="fanout") as port:
        print(f"one writer, one Set at a time, {seconds:.0f} s per phase, 1024 vbuckets")
        with window("set_rate_alone", bound="latency"):  # one Set at a time
            results["alone"] = write_phase(port, seconds, sample, "alone")
        ready = multiprocessing.Event()
        consumer = multiprocessing.Process(target=consume, args=(port, ready), daemon=True)
        consumer.start()
        if not ready.wait(60):
            raise SystemExit("the consumer's 1024 stream requests were not all answered")
        try:
            with window("set_rate_streamed_1024", bound="latency"):
                results["streamed"] = write_phase(port, seconds, sample, "streamed")
            load = multiprocessing.Process(target=hammer, args=(port,), daemon=True)
            load.start()
            try:
                results["loaded"] = write_phase(port, seconds, sample, "loaded")
            finally:
                load.kill()
        finally:
            consumer.kill()
    alone, streamed = results["alone"], results["streamed"]
    for name, r in results.items():
        print(
            f"  {name:<9} {r['rate']:>9,.0f} Sets/s   persisted after: p50 "
            f"{r['persist_p50_s'] * 1e3:8.1f} ms  p99 {r['persist_p99_s'] * 1e3:8.1f} ms  "
            f"max {r['persist_max_s'] * 1e3:8.1f} ms"
        )
    ratio = streamed["rate"] / alone["rate"]
    print(f"  streamed / alone: {ratio:.2f}x  (target >= 0.8x; persisted p50 <= 0.5 s, max <= 2 s)")
    print(f"one Set at a time, round trip: two servers, {rounds} turns of {slice_s:g} s each")
    with window("rtt_sets_per_s_alone", "rtt_sets_per_s_streamed_1024", bound="latency"):
        rtt = round_trips(rounds, slice_s)
    for name, r in rtt.items():
        print(f"  {name:<9} {r['rate']:>9,.0f} Sets/s   round trip p50 {r['p50_us']:7.0f} us  "
              f"p99 {r['p99_us']:7.0f} us")  # fmt: skip
    rtt_rate = rtt["streamed"]["rate"] / rtt["alone"]["rate"]
    rtt_p99 = rtt["streamed"]["p99_us"] / rtt["alone"]["p99_us"]
    print(f"  1024 streams / none: rate {rtt_rate:.2f}x (target >= 0.8x), "
          f"p99 {rtt_p99:.2f}x (target <= 2x)")  # fmt: skip
    write_json(
        json_out,
        "fanout",
        {
            "set_rate_alone": alone["rate"],
            "set_rate_streamed_1024": streamed["rate"],
            "streamed_over_alone": ratio,
            "persist_p50_s_streamed": streamed["persist_p50_s"],
            "persist_max_s_streamed": streamed["persist_max_s"],
            "persist_p50_s_loaded": results["loaded"]["persist_p50_s"],
            "persist_max_s_loaded": results["loaded"]["persist_max_s"],
            "rtt_sets_per_s_alone": rtt["alone"]["rate"],
            "rtt_sets_per_s_streamed_1024": rtt["streamed"]["rate"],
            "rtt_rate_streamed_over_alone": rtt_rate,
            "rtt_p50_us_alone": rtt["alone"]["p50_us"],
            "rtt_p50_us_streamed_1024": rtt["streamed"]["p50_us"],
            "rtt_p99_us_alone": rtt["alone"]["p99_us"],
            "rtt_p99_us_streamed_1024": rtt["streamed"]["p99_us"],
            "rtt_p99_streamed_over_alone": rtt_p99,
        },
        phases=results,
        round_trip=rtt,
    )


if __name__ == "__main__":
    bench_main(main)

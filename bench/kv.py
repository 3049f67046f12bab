"""Data-server throughput: pipelined Set and Get over 1 and 4 connections.

Theory of operation
-------------------
Starts a ``dcpkv server`` subprocess (fresh data dir in the temp dir, 1024 vbuckets) and, when
``memcached`` is on PATH, a ``memcached`` on a free loopback port (``-U 0``: no UDP; no SASL;
one worker thread per CPU it runs on), and drives both with the same client in the same run, so
the figures compare the servers rather than two clients.

The client is asyncio over the project's codec: every request is encoded before the clock
starts, in batches of ``--batch`` requests (100 by default) that go out in one write; the
connection then reads until that batch's answers are in, and sends the next batch. ``--ops``
operations (200,000) are split evenly over the connections, which run concurrently on one
event loop; a phase's rate is its operations over the wall time of the slowest connection.

Phases, per connection count, each count against a fresh server (of each kind): Set of distinct
keys (16-byte keys, 100-byte values) into the empty bucket, then Get of the same keys. So the
counts compare like with like (the Get phase runs ``GET_ROUNDS`` times, its figure the median
round's: it lasts about half a second; so does memcached's Set phase, each round against a fresh
memcached): a later count neither overwrites an earlier one's keys (a
different workload: the old version is freed) nor writes into a table the earlier one filled (a
flush's cost grows with the table: its writes land on more pages). Both servers get 512 MB, so
neither evicts nor ejects during a phase. Against dcpkv each request carries the key's vbucket
(as a smart client would) and each connection logs in with SASL PLAIN first; memcached ignores
the vbucket field. Any answer that is not Success is counted and shown, so a fast wrong answer
is not mistaken for a fast right one. A Set phase against dcpkv also shows when its last write
was on disk (polling the server's ``ep_total_persisted`` after the last answer;
``set_persisted_ops_per_s_*``): the rate counts acknowledgements, which come from memory, so
this says whether the flusher kept up or the phase only filled the write queue. Each phase also
shows the server process's CPU time per operation (user + system, all threads, from /proc): on a
machine shared with other work the wall-clock rate swings from run to run, the CPU cost much
less. ``--json PATH`` writes the rates (``set_ops_per_s_1conn``, memcached's as
``memcached_set_ops_per_s_1conn``, ...) and CPU costs (``set_server_cpu_us_per_op_1conn``, ...)
for ``make bench``'s summary."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

import _placement
from _report import bench_main, rounds, window, write_json
from _server import cpu_seconds
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.frame import FrameParser, encode_frame

VALUE = b"v" * 100
VBUCKETS = 1024
# The dcpkv bucket's quota, as memcached's ``-m 512``: a Set phase's keys (~630 accounted bytes
# each) fit up to --ops 800,000, so it measures Set and not the ejection of values a full bucket
# does (``bench/memory.py`` measures the quota at work).
QUOTA_MB = 512
START_TIMEOUT_S = 30.0
# 200k Gets last half a second: their figure is the median of this many (the Sets, 4-5 s, once)
GET_ROUNDS = 5
MEMCACHED_THREADS = 4  # memcached's default, unless placed (bench/_placement.py)
PERSIST_TIMEOUT_S = 120.0  # a Set phase's accepted writes must all be on disk by then
_SET_EXTRAS = struct.pack(">II", 0, 0)
_HEADER_LEN = 24
_STATUS_BODY = struct.Struct(">HI")  # a header's status and total body length, from offset 6
_SUCCESS = int(Status.Success)
_TMPFAIL = int(Status.Etmpfail)
_OPAQUE = struct.Struct(">I")  # a header's opaque, at offset 12


@dataclass(frozen=True)
class Target:
    name: str
    port: int
    login: bool  # SASL PLAIN first (dcpkv); memcached runs without SASL
    vbuckets: bool  # put the key's vbucket in the header
    pid: int  # the server process, for its CPU time


@dataclass(frozen=True)
class Result:
    ops: int
    seconds: float
    errors: int
    cpu_seconds: float  # the server's, user + system, all threads
    persisted_seconds: float | None = None  # start -> every write of the phase on disk

    @property
    def cpu_us_per_op(self) -> float:
        return self.cpu_seconds / self.ops * 1e6

    @property
    def rate(self) -> float:
        return self.ops / self.seconds


# -- requests ----------------------------------------------------------------------------------


def _key(i: int) -> bytes:
    return b"bench-key-%06d" % i


def _request(opcode: Opcode, i: int, target: Target) -> bytes:
    key = _key(i)
    vb = vbucket_for_key(key, VBUCKETS) if target.vbuckets else 0
    if opcode == Opcode.Set:
        return encode_frame(
            Magic.ClientRequest, opcode, key=key, extras=_SET_EXTRAS, value=VALUE,
            vbucket=vb, opaque=i,
        )  # fmt: skip
    return encode_frame(Magic.ClientRequest, opcode, key=key, vbucket=vb, opaque=i)


def batches(
    opcode: Opcode, keys: Sequence[int], batch: int, target: Target
) -> list[tuple[bytes, int]]:
    """The requests for ``keys`` (numbers, each its key and opaque), joined ``batch`` at a
    time: (bytes, request count)."""
    out = []
    for start in range(0, len(keys), batch):
        ids = keys[start : start + batch]
        out.append((b"".join(_request(opcode, i, target) for i in ids), len(ids)))
    return out


# -- one connection ------------------------------------------------------------------------------


class Answers:
    """Counts the answers in a byte stream and the ones that are not Success, by walking the
    24-byte headers (status at offset 6, body length at 8) without building frames.

    The client shares two cores with the server it measures: the codec's full
    :class:`~dcpkv.protocol.frame.FrameParser` cost the client about 2.5 us per answer, CPU the
    server then did not have. Both servers are read with this same scanner.
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.errors = 0
        self.tmpfail: list[int] = []  # the opaques answered Etmpfail (a client retries them)

    def feed(self, data: bytes) -> int:
        """How many whole answers ``data`` completes."""
        buf = self.buffer
        buf += data
        pos, end, count = 0, len(buf), 0
        while end - pos >= _HEADER_LEN:
            status, body = _STATUS_BODY.unpack_from(buf, pos + 6)
            if end - pos < _HEADER_LEN + body:
                break
            if status != _SUCCESS:
                self.errors += 1
                if status == _TMPFAIL:
                    self.tmpfail.append(_OPAQUE.unpack_from(buf, pos + 12)[0])
            pos += _HEADER_LEN + body
            count += 1
        del buf[:pos]
        return count


class Conn:
    """A pipelining client connection: write a batch, read its answers, repeat."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.answers = Answers()

    @property
    def errors(self) -> int:
        return self.answers.errors

    @classmethod
    async def open(cls, target: Target) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = cls(reader, writer)
        if target.login:
            value = b"\0Administrator\0password"
            await conn.run([(encode_frame(Magic.ClientRequest, Opcode.SaslAuth, key=b"PLAIN",
                                          value=value), 1)])  # fmt: skip
            if conn.errors:
                raise RuntimeError(f"{target.name}: login failed")
        return conn

    async def run(self, work: list[tuple[bytes, int]]) -> None:
        for payload, count in work:
            self.writer.write(payload)
            await self._answers(count)

    async def _answers(self, count: int) -> None:
        while count:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("server closed the connection")
            count -= self.answers.feed(data)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def phase(target: Target, opcode: Opcode, ops: int, conns: int, batch: int) -> Result:
    """``ops`` requests of one opcode over ``conns`` concurrent connections, on the keys
    numbered 0 .. ``ops``."""
    per = ops // conns
    work = [batches(opcode, range(n * per, (n + 1) * per), batch, target) for n in range(conns)]
    clients = [await Conn.open(target) for _ in range(conns)]
    durable = opcode == Opcode.Set and target.login  # dcpkv persists; memcached does not
    try:
        persisted_before = await items_persisted(clients[0]) if durable else 0
        cpu, start = cpu_seconds(target.pid), time.perf_counter()
        await asyncio.gather(*(c.run(w) for c, w in zip(clients, work, strict=True)))
        seconds, cpu = time.perf_counter() - start, cpu_seconds(target.pid) - cpu
        persisted = None
        if durable:
            # Only accepted writes reach disk: a refused one (over the memory quota) never
            # will, and waiting for it would hang the bench.
            accepted = per * conns - sum(c.errors for c in clients)
            deadline = time.monotonic() + PERSIST_TIMEOUT_S
            while await items_persisted(clients[0]) < persisted_before + accepted:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{accepted} accepted writes not persisted within "
                                       f"{PERSIST_TIMEOUT_S:.0f} s")  # fmt: skip
                await asyncio.sleep(0.05)
            persisted = time.perf_counter() - start
    finally:
        for c in clients:
            await c.close()
    return Result(per * conns, seconds, sum(c.errors for c in clients), cpu, persisted)


async def items_persisted(conn: Conn) -> int:
    """The server's ``ep_total_persisted`` (items written to disk so far)."""
    return await stat(conn, "ep_total_persisted")


async def stat(conn: Conn, name: str) -> int:
    """One of the server's integer stats, read with a Stat request on ``conn`` (outside the
    timed requests' answers: the full codec parses it)."""
    conn.writer.write(encode_frame(Magic.ClientRequest, Opcode.Stat))
    parser, found = FrameParser(), None
    while True:
        data = await conn.reader.read(1 << 16)
        if not data:
            raise ConnectionError("server closed the connection")
        for frame in parser.feed(data):
            if not frame.key:  # the empty stat ends the answer
                if found is None:
                    raise RuntimeError(f"the server's stats have no {name}")
                return found
            if frame.key == name.encode():
                found = int(frame.value)


# -- servers -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port_file(proc: subprocess.Popen[bytes], path: Path) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("dcpkv server did not start")
        time.sleep(0.02)
    return int(path.read_text())


def _wait_listening(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("memcached did not start")
        time.sleep(0.02)


@contextlib.contextmanager
def dcpkv_server(tmp: Path, quota_mb: int = QUOTA_MB, *extra: str) -> Iterator[Target]:
    """A ``dcpkv server`` in ``tmp`` (``extra``: more of its flags)."""
    port_file = tmp / "dcpkv.port"
    cmd = [
        sys.executable, "-m", "dcpkv.cli.main", "server", "--port", "0", "--data-dir",
        str(tmp / "data"), "--port-file", str(port_file), "--vbuckets", str(VBUCKETS),
        "--memory-quota-mb", str(quota_mb), *extra,
    ]  # fmt: skip
    with open(tmp / "dcpkv.log", "wb") as log, _placement.servers():
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        port = _wait_port_file(proc, port_file)
        yield Target("dcpkv", port, login=True, vbuckets=True, pid=proc.pid)
    finally:
        _stop(proc)


@contextlib.contextmanager
def memcached_server(binary: str) -> Iterator[Target]:
    port = _free_port()
    threads = _placement.server_threads(MEMCACHED_THREADS)
    cmd = [binary, "-p", str(port), "-U", "0", "-l", "127.0.0.1", "-m", "512", "-t", str(threads)]
    if os.geteuid() == 0:
        cmd += ["-u", "nobody"]  # memcached refuses to run as root
    with _placement.servers():
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(proc, port)
        yield Target("memcached", port, login=False, vbuckets=False, pid=proc.pid)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- main ----------------------------------------------------------------------------------------


def _bound(server: str, conns: int) -> str:
    """What a phase's rate is bound by (bench/_report.py): memcached answers a batch in a
    fraction of the client's time to send and read it, so one connection's rate against it is
    set by the two processes' wake-ups; dcpkv's by its own CPU."""
    return "latency" if server == "memcached" and conns == 1 else "cpu"


def _get_rounds(target: Target, ops: int, conns: int, batch: int, rate: str) -> tuple[Result, int]:
    """The Get phase :data:`GET_ROUNDS` times (bench/_report.py's rounds): the median round,
    and the errors of all rounds."""
    results: list[Result] = []

    def one() -> dict[str, float]:
        results.append(asyncio.run(phase(target, Opcode.Get, ops, conns, batch)))
        return {rate: results[-1].rate}

    rounds(GET_ROUNDS, one, bound=_bound(target.name, conns))
    ordered = sorted(results, key=lambda result: result.rate)
    return ordered[len(ordered) // 2], sum(result.errors for result in results)


def _row(target: Target, opcode: Opcode, conns: int, result: Result) -> list[str]:
    persisted = "-" if result.persisted_seconds is None else f"{result.persisted_seconds:.2f}"
    return [
        target.name, opcode.name, str(conns), f"{result.ops:,}", f"{result.rate:,.0f}",
        f"{result.seconds:.2f}", persisted, f"{result.cpu_us_per_op:.2f}", str(result.errors),
    ]  # fmt: skip


def _put(
    figures: dict[str, float],
    target: Target,
    opcode: Opcode,
    conns: int,
    result: Result,
    errors: int,
) -> None:
    """One phase's figures: its rate, errors, the server's CPU per op (and, for a dcpkv Set
    phase, its rate until persisted)."""
    prefix = "" if target.name == "dcpkv" else f"{target.name}_"
    op = opcode.name.lower()
    figures[f"{prefix}{op}_ops_per_s_{conns}conn"] = result.rate
    figures[f"{prefix}{op}_errors_{conns}conn"] = errors
    figures[f"{prefix}{op}_server_cpu_us_per_op_{conns}conn"] = result.cpu_us_per_op
    if result.persisted_seconds is not None:
        figures[f"{prefix}set_persisted_ops_per_s_{conns}conn"] = (
            result.ops / result.persisted_seconds
        )


def measure(
    target: Target, ops: int, batch: int, conns: int, figures: dict[str, float]
) -> list[list[str]]:
    """The table rows of one connection count's phases against a fresh dcpkv server (its Set
    phase once, in a window: each round would find other keys written); the rates also go
    into ``figures``."""
    rate = f"set_ops_per_s_{conns}conn"
    with window(rate, f"set_persisted_ops_per_s_{conns}conn", bound=_bound(target.name, conns)):
        sets = asyncio.run(phase(target, Opcode.Set, ops, conns, batch))
    gets, get_errors = _get_rounds(target, ops, conns, batch, f"get_ops_per_s_{conns}conn")
    _put(figures, target, Opcode.Set, conns, sets, sets.errors)
    _put(figures, target, Opcode.Get, conns, gets, get_errors)
    return [_row(target, Opcode.Set, conns, sets), _row(target, Opcode.Get, conns, gets)]


def measure_memcached(
    binary: str, ops: int, batch: int, conns: int, figures: dict[str, float]
) -> list[list[str]]:
    """As :func:`measure` against memcached, whose Set phase lasts a fraction of a second: it
    runs :data:`GET_ROUNDS` times, each against a fresh memcached (an empty cache, as dcpkv's
    Set phase finds), the figure the median round's; the Gets run on the last one."""
    rate = f"memcached_set_ops_per_s_{conns}conn"
    done: list[tuple[Target, Result]] = []
    with contextlib.ExitStack() as server:

        def one() -> dict[str, float]:
            server.close()  # the previous round's memcached
            target = server.enter_context(memcached_server(binary))
            done.append((target, asyncio.run(phase(target, Opcode.Set, ops, conns, batch))))
            return {rate: done[-1][1].rate}

        rounds(GET_ROUNDS, one, bound=_bound("memcached", conns))
        target = done[-1][0]
        get_rate = f"memcached_get_ops_per_s_{conns}conn"
        gets, get_errors = _get_rounds(target, ops, conns, batch, get_rate)
    sets = sorted((result for _, result in done), key=lambda result: result.rate)
    set_errors = sum(result.errors for _, result in done)
    _put(figures, target, Opcode.Set, conns, sets[len(sets) // 2], set_errors)
    _put(figures, target, Opcode.Get, conns, gets, get_errors)
    return [_row(target, Opcode.Set, conns, sets[len(sets) // 2]),
            _row(target, Opcode.Get, conns, gets)]  # fmt: skip


def main(
    ops: int = typer.Option(200_000, help="operations per phase"),
    batch: int = typer.Option(100, help="requests per write"),
    connections: str = typer.Option("1,4", help="connection counts, comma-separated"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    conn_counts = [int(c) for c in connections.split(",")]
    rows: list[list[str]] = []
    figures: dict[str, float] = {}
    for conns in conn_counts:
        with (
            tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp,
            dcpkv_server(Path(tmp)) as target,
        ):
            rows += measure(target, ops, batch, conns, figures)
    binary = shutil.which("memcached")
    if binary:
        for conns in conn_counts:
            rows += measure_memcached(binary, ops, batch, conns, figures)
    table = Table(title=f"Pipelined KV throughput ({batch} requests per write, {len(VALUE)}-byte "
                  "values, one asyncio client process)")  # fmt: skip
    for col in ("server", "op", "connections", "ops", "ops/s", "seconds", "all persisted at s",
                "server CPU us/op", "errors"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("server", "op") else "right")
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    if not binary:
        console.print("memcached not on PATH: only dcpkv measured (apt-get install memcached)")
    write_json(json_out, "kv", figures)


if __name__ == "__main__":
    bench_main(main)

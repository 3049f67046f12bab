"""Memory: the server's RSS per resident item, and whether the memory quota bounds the process.

Theory of operation
-------------------
Both phases drive a fresh ``dcpkv server`` subprocess (1024 vbuckets) over one connection with
pipelined Sets (16-byte keys, ``--value-size`` bytes, 100 by default), ``--batch`` per write,
and read the server's memory from ``/proc/PID/status`` (its PID comes from ``stat``): VmRSS
now and VmHWM, the kernel's high-water mark of RSS, so a peak between two samples is not
missed. The baseline is the RSS of the idle server before the first write.

1. **Per item**: a quota far above the data (4 GiB), ``--items`` Sets (1M), one second for the
   flusher, then RSS growth per item against the item's own bytes, key + value + metadata
   (the 33 bytes of metadata a DCP mutation carries: seqno, rev seqno, CAS, flags, expiry,
   datatype), and the bucket's own figure (``stat`` ``mem_used``) against the RSS growth.
2. **Quota**: a ``--quota-mb`` quota (64 MiB) and four quotas' worth of Sets, once of 100-byte
   values (mostly key and metadata, which stay resident: the bucket must fill up and refuse)
   and once of 4 KiB values (ejecting persisted values makes room for all of them). A write
   answered Etmpfail is retried after 20 ms, as a client should; once the phase has retried
   500 times (10 s of pauses) it ends: the bucket is full of keys and metadata.
   The figure is the peak RSS growth over the quota, and over what docs/server.md allows:
   1.25x the quota + 16 MiB (``tests/server/test_memory_quota.py`` proves it on 8 MiB).

``--json PATH`` writes the figures for ``make bench``'s summary.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections import deque
from pathlib import Path
from typing import Annotated

import typer

from _report import bench_main, write_json
from _server import bench_server
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.frame import FrameParser, encode_frame

VBUCKETS = 1024
KEY_LEN = 16
META_LEN = 33  # by seqno 8, rev seqno 8, CAS 8, flags 4, expiry 4, datatype 1
MIB = 1024 * 1024
_SET_EXTRAS = struct.pack(">II", 0, 0)
RETRY_PAUSE_S = 0.02
# docs/server.md's promise: RSS grows by at most RSS_MARGIN x the quota + RSS_SLACK_MIB.
RSS_MARGIN = 1.25
RSS_SLACK_MIB = 16
RETRY_BUDGET = 500  # retry rounds per phase (10 s of pauses): past that, the bucket is full


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(rest.split()[0]) * 1024
    return out


class Writer:
    """One blocking connection: pipelined Sets, the statuses read back by opaque."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser()
        self.pending: deque[tuple[int, bytes, bytes]] = deque()  # answers read, not yet taken
        self.call(Opcode.SaslAuth, key=b"PLAIN", value=b"\0Administrator\0password")

    def call(self, opcode: int, **kw: object) -> tuple[int, bytes, bytes]:
        self.sock.sendall(encode_frame(Magic.ClientRequest, opcode, **kw))  # type: ignore[arg-type]
        frames = self._read(1)
        return frames[0]

    def _read(self, count: int) -> list[tuple[int, bytes, bytes]]:
        while len(self.pending) < count:
            data = self.sock.recv(1 << 20)
            if not data:
                raise SystemExit("server closed the connection")
            self.pending += [
                (f.status, bytes(f.key), bytes(f.value)) for f in self.parser.feed(data)
            ]
        return [self.pending.popleft() for _ in range(count)]

    def stats(self) -> dict[str, str]:
        self.sock.sendall(encode_frame(Magic.ClientRequest, Opcode.Stat))
        out: dict[str, str] = {}
        while True:
            status, key, value = self._read(1)[0]
            if status != Status.Success or not key:
                return out
            out[key.decode()] = value.decode()

    def set_many(self, keys: list[bytes], value: bytes) -> list[bytes]:
        """Set every key (one pipelined write); the keys answered Etmpfail."""
        frames = [
            encode_frame(Magic.ClientRequest, Opcode.Set, key=k, value=value,
                         extras=_SET_EXTRAS, vbucket=vbucket_for_key(k, VBUCKETS), opaque=i)
            for i, k in enumerate(keys)
        ]  # fmt: skip
        self.sock.sendall(b"".join(frames))
        refused = []
        # _read keeps the order of answers; the server answers a connection in request order
        for key, (status, _, _) in zip(keys, self._read(len(keys)), strict=True):
            if status == Status.Etmpfail:
                refused.append(key)
            elif status != Status.Success:
                raise SystemExit(f"Set answered 0x{status:02x}")
        return refused

    def write(self, count: int, value: bytes, batch: int, tag: bytes) -> tuple[int, int]:
        """``count`` distinct keys, retrying Etmpfail; (accepted, not written). The retries of
        the whole phase share one budget: once it is spent the bucket is full of what it
        cannot eject (keys and metadata stay resident) and writes only trickle in."""
        accepted, retries = 0, 0
        for base in range(0, count, batch):
            keys = [b"%s%013d" % (tag, i) for i in range(base, min(count, base + batch))]
            while keys:
                refused = self.set_many(keys, value)
                accepted += len(keys) - len(refused)
                keys = refused
                if keys:
                    retries += 1
                    if retries > RETRY_BUDGET:
                        return accepted, count - accepted
                    time.sleep(RETRY_PAUSE_S)  # the flusher must catch up before values can go
        return accepted, 0


def per_item(items: int, value_size: int, batch: int) -> dict[str, float]:
    with bench_server(VBUCKETS, "--memory-quota-mb", "4096", label="memory") as port:
        w = Writer(port)
        pid = int(w.stats()["pid"])
        base = proc_status(pid)["VmRSS"]
        accepted, _ = w.write(items, b"v" * value_size, batch, b"mem")
        time.sleep(1.0)  # let the flusher persist what it holds
        stats = w.stats()
        rss = proc_status(pid)["VmRSS"]
    growth = rss - base
    payload = KEY_LEN + value_size + META_LEN
    mem_used = int(stats["mem_used"])
    return {
        "items": accepted,
        "rss_base_mib": base / MIB,
        "rss_mib": rss / MIB,
        "rss_bytes_per_item": growth / accepted,
        "key_value_meta_bytes_per_item": payload,
        "rss_over_key_value_meta": growth / accepted / payload,
        "mem_used_mib": mem_used / MIB,
        "mem_used_bytes_per_item": mem_used / accepted,
        "mem_used_over_rss_growth": mem_used / growth,
    }


def quota_holds(quota_mb: int, value_size: int, batch: int) -> dict[str, float]:
    """Four quotas' worth of Sets of ``value_size`` bytes; figures suffixed with the size."""
    value = b"q" * value_size
    count = 4 * quota_mb * MIB // (KEY_LEN + value_size)
    allowed = (RSS_MARGIN * quota_mb + RSS_SLACK_MIB) * MIB
    with bench_server(VBUCKETS, "--memory-quota-mb", str(quota_mb), label="quota") as port:
        w = Writer(port)
        pid = int(w.stats()["pid"])
        base = proc_status(pid)["VmRSS"]
        accepted, given_up = w.write(count, value, batch, b"quota")
        stats = w.stats()
        peak = proc_status(pid)["VmHWM"]
    figures = {
        "quota_mib": quota_mb,
        "quota_writes": count,
        "quota_accepted": accepted,
        "quota_not_written": given_up,
        "quota_rss_peak_growth_mib": (peak - base) / MIB,
        "quota_rss_growth_over_quota": (peak - base) / (quota_mb * MIB),
        "quota_rss_growth_over_allowed": (peak - base) / allowed,
        "quota_mem_used_mib": int(stats["mem_used"]) / MIB,
    }
    return {f"{name}_{value_size}b": value for name, value in figures.items()}


def main(
    items: int = typer.Option(1_000_000, help="items written for the per-item figure"),
    value_size: int = typer.Option(100, help="value bytes for the per-item figure"),
    quota_mb: int = typer.Option(64, help="memory quota of the quota phase, MiB"),
    quota_value_sizes: str = typer.Option("100,4096", help="value bytes of the quota phases"),
    batch: int = typer.Option(500, help="Sets per pipelined write"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    print(f"memory bench: {items:,} items of {KEY_LEN}+{value_size} bytes, {VBUCKETS} vbuckets")
    figures = per_item(items, value_size, batch)
    print(
        f"  RSS {figures['rss_base_mib']:.0f} -> {figures['rss_mib']:.0f} MiB: "
        f"{figures['rss_bytes_per_item']:.0f} bytes/item, "
        f"{figures['rss_over_key_value_meta']:.2f}x key+value+meta "
        f"({figures['key_value_meta_bytes_per_item']:.0f} bytes)"
    )
    print(
        f"  mem_used {figures['mem_used_mib']:.0f} MiB = "
        f"{figures['mem_used_bytes_per_item']:.0f} bytes/item, "
        f"{figures['mem_used_over_rss_growth']:.2f}x the RSS growth"
    )
    for size in (int(v) for v in quota_value_sizes.split(",")):
        q = quota_holds(quota_mb, size, batch)
        figures |= q
        print(
            f"  quota {quota_mb} MiB, {q[f'quota_writes_{size}b']:,.0f} Sets of {size} bytes: "
            f"{q[f'quota_accepted_{size}b']:,.0f} accepted, "
            f"{q[f'quota_not_written_{size}b']:,.0f} not written; peak RSS growth "
            f"{q[f'quota_rss_peak_growth_mib_{size}b']:.0f} MiB = "
            f"{q[f'quota_rss_growth_over_quota_{size}b']:.2f}x the quota "
            f"(mem_used {q[f'quota_mem_used_mib_{size}b']:.0f} MiB)"
        )
    write_json(json_out, "memory", figures)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    bench_main(main)

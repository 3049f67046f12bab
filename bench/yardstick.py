"""The machine yardstick: a fixed pure-Python workload that says how fast this machine is now.

Theory of operation
-------------------
This host's speed swings 5-10x from hour to hour (other work shares its two cores), so a
benchmark's absolute figure says as much about the machine as about the code. Every benchmark
run times this workload at its start and at its end (``bench/_report.py`` runs it in a fresh
process, so the benchmark's own heap and threads do not weigh on it) and reports each of its
throughputs also as a ratio to the yardstick: a ratio travels between runs and machines where
the absolute figure does not. Two timings that differ by more than 20 % say the machine
changed speed during the run.

The workload is the codec's floor, with no project code: the standard library's ``struct``
encoding ``FRAMES`` memcached-binary DCP Mutation frames (24-byte header, 31 bytes of extras:
by-seqno, rev-seqno, flags, expiry, lock time, metadata length, NRU; a 16-byte key and a
100-byte value), ``BATCH`` at a time into one buffer as a producer's send would, then decoding
that buffer frame by frame (header, extras, key and value copied out, one tuple per
message, dropped) as a consumer would. One figure, frames/s, each frame encoded and decoded
once: the fastest of ``ROUNDS`` short rounds. Other work on the host can only slow a round,
never speed it up, so the fastest round is the machine's own speed; on this host the median
of 7 rounds of fresh samples ranged over 0.57-1.0x of the highest, the fastest of the same
rounds over 0.92-1.0x but for one in 24. The workload is fixed: changing it changes every
ratio ever recorded.

Each measurement first runs its workload untimed for ``WARMUP_S``: a process that has just
started (or a CPU that was idle) runs its first tens of milliseconds at as little as 0.6x its
steady speed on this host, and a sample of a few rounds then timed that, not the machine (15
fresh samples of 5 rounds: 616k-1.14M frames/s cold, 1.09M-1.14M after 0.15 s of warm-up).

Not every figure is bound by the CPU. A one-connection stop-and-wait rate is bound by how fast
the host wakes a process that a socket woke, which does not move with the CPU yardstick (two
quiet runs showed it); a Set or a Get over a bucket of millions of items waits on memory, whose
speed on this host moves apart from the CPU's. So there are three yardsticks, one per resource
(``--kind``), and a figure is divided by the one it is bound by (``bench/README.md`` names
which figures go with which):

* ``cpu`` (the default): the codec's floor above, frames/s;
* ``latency``: round trips over a loopback TCP connection between this process and a child,
  ``HEADER``-byte requests each answered with as many bytes (a Get's header both ways, no
  pipelining, ``TCP_NODELAY``), round trips per second (``trips/s``), the fastest of
  ``ROUNDS`` rounds of ``ROUND_TRIPS``. The two processes are pinned to two different CPUs
  (when there are two): left to the scheduler, they now and then shared one CPU, where a round
  trip is a plain context switch, 3-4x faster (45-63k against 10-17k trips/s on this host), and
  such a sample made a quiet run's ratio swing 2x.
* ``memory``: a chase through a random cycle over a list of ``MEMORY_SLOTS`` ints, 8x this
  host's L3 cache in pointers alone (each step reads the slot the previous one named and the
  int object in it: two places far from the last in memory), steps per second (``steps/s``),
  the fastest of ``ROUNDS`` rounds of ``MEMORY_STEPS``.

``--probe PATH`` times short bursts of the cpu workload and of the memory chase until its
parent exits, for ``bench/_report.py`` to know the machine's speed while a figure was measured
(:func:`probe`).

Run alone: ``python bench/yardstick.py [--kind K]`` prints ``yardstick.frames_per_s VALUE
frames/s`` (or its kind's figure; ``--value`` just the number, ``--json PATH`` also writes it
as a benchmark's JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

FRAMES = 20_000  # per round
ROUNDS = 9
WARMUP_S = 0.15  # untimed work before the first timed round (module docstring)
BATCH = 500  # frames joined into one buffer, as one socket write
UNIT = "frames/s"

# magic, opcode, key length, extras length, datatype, vbucket, body length, opaque, CAS, then
# the extras: by-seqno, rev-seqno, flags, expiry, lock time, metadata length, NRU
_MUTATION = struct.Struct(">BBHBBHIIQQQIIIHB")
_HEADER = struct.Struct(">BBHBBHIIQ")
_EXTRAS = struct.Struct(">QQIIIHB")
_REQUEST, _DCP_MUTATION = 0x80, 0x57
_KEY_LEN, _VALUE = 16, b"\x5a" * 100
_BODY = _EXTRAS.size + _KEY_LEN + len(_VALUE)


def encode(keys: list[bytes]) -> list[bytes]:
    """The frames of ``keys``, ``BATCH`` to a buffer."""
    pack, out = _MUTATION.pack, []
    for first in range(0, len(keys), BATCH):
        frames = [
            pack(_REQUEST, _DCP_MUTATION, _KEY_LEN, _EXTRAS.size, 0, i & 1023, _BODY, i, i << 16,
                 i + 1, 1, 0, 0, 0, 0, 0) + keys[i] + _VALUE
            for i in range(first, min(first + BATCH, len(keys)))
        ]  # fmt: skip
        out.append(b"".join(frames))
    return out


def decode(buffer: bytes) -> tuple[int, int]:
    """(frames, sum of their by-seqnos) of a buffer of whole frames."""
    header, extras = _HEADER.unpack_from, _EXTRAS.unpack_from
    at, end, count, total = 0, len(buffer), 0, 0
    while at < end:
        _magic, _op, key_len, extras_len, _dt, vbucket, body, _opaque, cas = header(buffer, at)
        by_seqno, _rev, flags, expiry, _lock, _nmeta, _nru = extras(buffer, at + 24)
        key_at = at + 24 + extras_len
        value_at = key_at + key_len
        at += 24 + body
        message = (vbucket, by_seqno, cas, flags, expiry, buffer[key_at:value_at],
                   buffer[value_at:at])  # fmt: skip
        count += 1
        total += message[1]
    return count, total


def one_round(keys: list[bytes]) -> float:
    """Seconds to encode and decode every key's frame once (checked)."""
    start = time.perf_counter()
    frames = seqnos = 0
    for buffer in encode(keys):
        n, s = decode(buffer)
        frames, seqnos = frames + n, seqnos + s
    seconds = time.perf_counter() - start
    if frames != len(keys) or seqnos != len(keys) * (len(keys) + 1) // 2:
        raise AssertionError("the yardstick decoded something else than it encoded")
    return seconds


def measure(frames: int = FRAMES, rounds: int = ROUNDS) -> float:
    """frames/s: the fastest round's, after ``WARMUP_S`` of untimed rounds."""
    keys = [b"yardstick-%06d" % (i % 1_000_000) for i in range(frames)]
    warm_until = time.perf_counter() + WARMUP_S
    while time.perf_counter() < warm_until:
        one_round(keys)
    return frames / min(one_round(keys) for _ in range(rounds))


MEMORY_SLOTS = 1 << 23  # the chase's list: 64 MiB of pointers to ~230 MiB of ints
MEMORY_STEPS = 200_000  # per round of the memory yardstick
MEMORY_SEED = 35  # the cycle is fixed: changing it changes every memory figure recorded

PROBE_FRAMES = 2_000  # a probe burst: ~2 ms of the workload on this host
PROBE_STEPS = 5_000  # a probe's memory burst: ~2.5 ms of the chase on this host
PROBE_PERIOD_S = 0.1  # between bursts: ~5 % of one CPU


def cpu_ticks() -> dict[str, tuple[int, int]]:
    """(busy, all) clock ticks since boot of each CPU line of ``/proc/stat``: ``cpu`` (every
    CPU) and ``cpu0``, ``cpu1``, ...; empty without it. Busy: user, nice, system, irq and
    softirq; not idle, iowait or steal (another tenant's)."""
    out = {}
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            for line in stat:
                if not line.startswith("cpu"):
                    break
                fields = line.split()
                user, nice, system, idle, iowait, irq, softirq = map(int, fields[1:8])
                busy = user + nice + system + irq + softirq
                out[fields[0]] = (busy, busy + idle + iowait)
    except (OSError, ValueError):
        return {}
    return out


def _ticks_by_cpu() -> dict[int, tuple[int, int]]:
    return {int(name[3:]): ticks for name, ticks in cpu_ticks().items() if name != "cpu"}


def _busiest(
    last: dict[int, tuple[int, int]], now: dict[int, tuple[int, int]], allowed: set[int]
) -> tuple[int | None, float]:
    """The allowed CPU that did the most work from ``last`` to ``now`` (``cpu_ticks``), and
    the fraction of that time it was busy (0.0 when nothing was counted)."""

    def work(cpu: int) -> int:
        return now[cpu][0] - last.get(cpu, (0, 0))[0]

    busiest = max((c for c in now if c in allowed), default=None, key=work)
    if busiest is None:
        return None, 0.0
    elapsed = now[busiest][1] - last.get(busiest, (0, 0))[1]
    return busiest, work(busiest) / elapsed if elapsed > 0 else 0.0


def probe(
    out: Path,
    period: float = PROBE_PERIOD_S,
    frames: int = PROBE_FRAMES,
    slots: int = MEMORY_SLOTS,
    steps: int = PROBE_STEPS,
) -> None:
    """Time a burst of the cpu workload and then one of the memory chase every ``period``
    seconds, at the lowest priority, on the CPU that was busiest since the last bursts, and
    append ``MONOTONIC FRAMES_PER_S STEPS_PER_S CPU BUSY`` to ``out`` for each pair (``BUSY``:
    the fraction of the time since the last pair that CPU was busy), until the parent process
    is gone. The chase's list is built first (about a second), and each memory burst
    goes on from where the last stopped, so it walks slots no recent burst cached.

    Why this way, on this host: a CPU runs at two speeds, about 1.3M and 0.8M frames/s, in
    phases of tens to hundreds of milliseconds, and mostly at the lower for up to 0.3 s after
    it was idle. A burst on a CPU that the benchmark keeps busy runs at the speed the
    benchmark's work gets (with one CPU busy: 1.11-1.15M at the 10th percentile of bursts);
    on the idle other CPU it would time the wake-up (0.69M), and so it does when the
    benchmark keeps no CPU busy (a live stream's trickle, a paced writer): ``BUSY`` lets
    ``bench/_report.py`` leave such bursts out (:data:`_report.PROBE_BUSY`). A burst is timed
    by this thread's CPU time, not the wall clock: the benchmark's work on the same CPU delays
    a burst without slowing it, and the CPU time leaves the delay out (a wait on memory is CPU
    time: the CPU stalls, it does not switch)."""
    os.nice(19)
    parent = os.getppid()
    following = memory_cycle(slots)
    keys = [b"yardstick-%06d" % i for i in range(frames)]
    at, warm_until = 0, time.perf_counter() + WARMUP_S
    while time.perf_counter() < warm_until:
        one_round(keys)
        at = _chase(following, steps, at)
    allowed = os.sched_getaffinity(0)
    last = _ticks_by_cpu()
    with out.open("a", encoding="ascii") as log:
        while os.getppid() == parent:
            now = _ticks_by_cpu()
            busiest, busy = _busiest(last, now, allowed)
            if busiest is not None:
                os.sched_setaffinity(0, {busiest})
            last = now
            start = time.thread_time()
            one_round(keys)
            middle = time.thread_time()
            at = _chase(following, steps, at)
            cpu, memory = middle - start, time.thread_time() - middle
            if cpu > 0 and memory > 0:
                log.write(f"{time.monotonic():.4f} {frames / cpu:.0f} {steps / memory:.0f} "
                          f"{busiest} {busy:.2f}\n")  # fmt: skip
                log.flush()
            time.sleep(period)


ROUND_TRIPS = 300  # per round of the latency yardstick
HEADER = 24  # bytes each way: a memcached header


def _echo(listener: socket.socket) -> None:
    """The child's side: answer each request, one at a time, until the other side closes."""
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    answer = b"\x81" * HEADER
    while True:
        got = 0
        while got < HEADER:
            chunk = conn.recv(HEADER - got)
            if not chunk:
                conn.close()
                return
            got += len(chunk)
        conn.sendall(answer)


def _trips(conn: socket.socket, count: int) -> None:
    request = b"\x80" * HEADER
    for _ in range(count):
        conn.sendall(request)
        got = 0
        while got < HEADER:
            got += len(conn.recv(HEADER - got))


def _ping(port: int, rounds: int) -> float:
    """Round trips per second: the fastest round's (each answer read whole)."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times: list[float] = []
    warm_until = time.perf_counter() + WARMUP_S
    while time.perf_counter() < warm_until:
        _trips(conn, ROUND_TRIPS // 10)
    for _ in range(rounds):
        start = time.perf_counter()
        _trips(conn, ROUND_TRIPS)
        times.append(time.perf_counter() - start)
    conn.close()
    return ROUND_TRIPS / min(times)


def measure_latency(rounds: int = ROUNDS) -> float:
    """Round trips per second to a child process over loopback TCP (module docstring)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    cpus = sorted(os.sched_getaffinity(0))[:2]
    child = os.fork()
    if len(cpus) == 2:  # one CPU each (module docstring)
        os.sched_setaffinity(0, {cpus[child == 0]})
    if child == 0:  # the echo side never returns into the caller's code
        try:
            _echo(listener)
        finally:
            os._exit(0)
    listener.close()
    try:
        return _ping(port, rounds)
    finally:
        os.waitpid(child, 0)


def memory_cycle(slots: int) -> list[int]:
    """A random cycle through every slot: slot ``i`` holds the slot visited after ``i``.

    Built with numpy (0.8 s for 8M slots on this host, against 7.8 s in pure Python), so the
    probe can build one per benchmark; the chase itself is pure Python, over a list of ints."""
    import numpy as np  # here: a cpu sample's fresh process does not pay for its import

    order = np.random.default_rng(MEMORY_SEED).permutation(slots)
    following = np.empty(slots, dtype=np.int64)
    following[order] = np.roll(order, -1)
    return following.tolist()  # type: ignore[no-any-return]


def _chase(following: list[int], steps: int, at: int = 0) -> int:
    """The slot reached after following ``steps`` slots from slot ``at``."""
    for _ in range(steps):
        at = following[at]
    return at


def measure_memory(
    rounds: int = ROUNDS, slots: int = MEMORY_SLOTS, steps: int = MEMORY_STEPS
) -> float:
    """Steps/s of a chase through a list too large for the CPU's caches (module docstring):
    the fastest round's, after ``WARMUP_S`` of untimed steps. Each round goes on from where
    the last stopped, so no round walks slots that an earlier one brought into the caches
    (200k steps touch ~25 MB, within this host's 32 MiB L3)."""
    following = memory_cycle(slots)
    at, warm_until = 0, time.perf_counter() + WARMUP_S
    while time.perf_counter() < warm_until:
        at = _chase(following, steps // 10, at)
    fastest = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        at = _chase(following, steps, at)
        fastest = min(fastest, time.perf_counter() - start)
    return steps / fastest


# kind -> (its measurement, given rounds; its figure's name; its unit)
KINDS: dict[str, tuple[Callable[[int], float], str, str]] = {
    "cpu": (lambda rounds: measure(rounds=rounds), "frames_per_s", UNIT),
    "latency": (measure_latency, "round_trips_per_s", "trips/s"),
    "memory": (measure_memory, "memory_steps_per_s", "steps/s"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description="the machine yardstick (bench/README.md)")
    parser.add_argument("--value", action="store_true", help="print the number only")
    parser.add_argument("--json", type=Path, help="write it as a benchmark's JSON")
    parser.add_argument("--name", default="yardstick", help="the figure's bench name")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"rounds to take the fastest of (default {ROUNDS})")  # fmt: skip
    parser.add_argument("--kind", choices=sorted(KINDS), default="cpu",
                        help="the resource to time (module docstring; default cpu)")  # fmt: skip
    parser.add_argument("--probe", type=Path, metavar="PATH",
                        help="time short bursts until the parent exits, appending "
                             "'MONOTONIC FRAMES_PER_S STEPS_PER_S CPU BUSY' to PATH "
                             "(bench/_report.py)")  # fmt: skip
    parser.add_argument("--slots", type=int, default=MEMORY_SLOTS,
                        help="the probe's memory chase: slots of its list (default "
                             f"{MEMORY_SLOTS:,}; fewer only for a test)")  # fmt: skip
    args = parser.parse_args()
    if args.probe is not None:
        probe(args.probe, slots=args.slots)
        return 0
    timed, metric, unit = KINDS[args.kind]
    rate = timed(args.rounds)
    if args.value:
        print(f"{rate:.0f}")
        return 0
    print(f"{args.name}.{metric} {rate:.0f} {unit}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        body = {"bench": args.name, "figures": {metric: rate},
                "units": {metric: unit}}  # fmt: skip
        args.json.write_text(json.dumps(body, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

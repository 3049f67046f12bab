"""Codec throughput: encode and decode rates for DCP mutations.

Theory of operation
-------------------
Builds ``--count`` DCP Mutation messages (16-byte key, 100-byte value, the shape of a small
document change), then times four things with ``time.perf_counter``:

* encode: ``Mutation.encode()`` for every message;
* parse: ``FrameParser.feed`` over one big buffer of all the encoded frames;
* decode: parse plus ``Mutation.decode`` of each frame into the typed message (what a
  consumer pays per change);
* fused: the same mutations, with their flow-control sizes, straight from the buffer by
  ``fast_dcp.feed_mutations`` (no Frame in between: what the client's receive path pays).

Each operation runs :data:`ROUNDS` times, each between two yardstick samples
(``bench/_report.py``'s ``rounds``: a pure-Python figure moves with the host as the yardstick
does, so its ratio holds only when both are timed together); the medians are printed as a rich
table, in messages/s and MB/s of wire bytes, and as the figures (``--json PATH``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from _report import bench_main, rounds, write_json
from dcpkv.protocol import FrameParser
from dcpkv.protocol.dcp import Mutation
from dcpkv.protocol.fast_dcp import feed_mutations

KEY_LEN = 16
VALUE_LEN = 100
ROUNDS = 3  # of each figure


def _mutations(count: int) -> list[Mutation]:
    value = b"v" * VALUE_LEN
    return [
        Mutation(
            key=b"key-%012d" % i,
            value=value,
            by_seqno=i + 1,
            rev_seqno=1,
            opaque=7,
            vbucket=i & 1023,
        )
        for i in range(count)
    ]


def _timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    n = fn()
    return time.perf_counter() - start, n


def _rounds_of(metric: str, fn: Callable[[], int], count: int) -> dict[str, float]:
    def one() -> dict[str, float]:
        seconds, n = _timed(fn)
        assert n == count, f"{metric}: {n:,} messages, not {count:,}"
        return {metric: count / seconds}

    return rounds(ROUNDS, one)


def run(
    count: int = typer.Option(1_000_000, "--count", help="mutations per run"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    messages = _mutations(count)
    encoded: list[bytes] = []

    def encode() -> int:
        encoded[:] = [m.encode() for m in messages]
        return len(encoded)

    encode()  # (the frames every other operation reads)
    buffer = b"".join(encoded)
    assert len(encoded[0]) == 24 + 31 + KEY_LEN + VALUE_LEN

    def parse() -> int:
        return sum(1 for _ in FrameParser().feed(buffer))

    def decode() -> int:
        # each message is dropped after decoding, as a consumer applying changes would;
        # keeping a million of them alive measures the garbage collector instead
        decode_one = Mutation.decode
        n = 0
        for frame in FrameParser().feed(buffer):
            decode_one(frame)
            n += 1
        return n

    def fused() -> int:
        n = 0
        for run in feed_mutations(FrameParser(), buffer):
            assert isinstance(run, list)  # nothing but plain mutations in this buffer
            n += len(run)
        return n

    # the figures: each operation ROUNDS times between yardstick samples (bench/_report.py)
    figures: dict[str, float] = {}
    rows = (("encode", "encode_msgs_per_s", encode), ("parse frames", "parse_msgs_per_s", parse),
            ("parse + decode", "parse_decode_msgs_per_s", decode),
            ("parse + decode, fused", "parse_decode_fused_msgs_per_s", fused))  # fmt: skip
    for _, metric, fn in rows:
        figures |= _rounds_of(metric, fn, count)
    table = Table(title=f"DCP Mutation codec, {count:,} messages of {len(encoded[0])} bytes "
                  f"(the median of {ROUNDS} rounds)")  # fmt: skip
    for column in ("operation", "seconds", "messages/s", "MB/s", "µs/message"):
        table.add_column(column, justify="right")
    for name, metric, _ in rows:
        seconds = count / figures[metric]
        table.add_row(
            name,
            f"{seconds:.3f}",
            f"{count / seconds:,.0f}",
            f"{len(buffer) / seconds / 1e6:,.1f}",
            f"{seconds / count * 1e6:.3f}",
        )
    Console().print(table)
    write_json(json_out, "codec", figures)


if __name__ == "__main__":
    bench_main(run)

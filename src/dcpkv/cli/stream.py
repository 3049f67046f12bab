"""``dcpkv stream`` and ``dcpkv failover-log``: the DCP client on the command line.

Theory of operation
-------------------
One :class:`~dcpkv.client.consumer.Consumer` in ``asyncio.run``. Every change event becomes
one output line (JSON lines, or a table); rollbacks are printed too, since whoever reads the
output must undo what lies above them. The events come in lists
(:meth:`~dcpkv.client.consumer.Consumer.stream_chunks`, ``CHUNK_EVENTS``), each turned into
its line as it is made (:func:`line_of`), so a list costs one async step and one call into
the writer. JSON lines are encoded by orjson (UTF-8, not ASCII escapes) and written in large
blocks (:class:`LineWriter`, ``WRITE_BYTES``): a ``write`` per line cost more than the
consumer's own work. Offsets are saved atomically (``Offsets.save``) at most every
``SAVE_EVERY_EVENTS`` events or ``SAVE_EVERY_S`` seconds, and at exit, always between lists
(where the consumer's offsets are exactly after the last event taken); the output is flushed
before each save, so a saved offset never runs ahead of what was written out.
SIGINT and SIGTERM cancel the stream task: offsets are saved and the exit code is 0.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any, Literal

import orjson

from dcpkv.client import events
from dcpkv.client.consumer import Consumer, End, Start
from dcpkv.client.offsets import Offsets
from dcpkv.client.settings import ClientSettings
from dcpkv.core import event_loop

SAVE_EVERY_EVENTS = 10_000
SAVE_EVERY_S = 1.0
WRITE_BYTES = 1 << 18  # output written in blocks of this size (and before every save)
CHUNK_EVENTS = 256  # events taken from the consumer at once


def parse_end(text: str) -> Literal["now", "forever"]:
    """``--to``: now (the high seqnos at start) or forever."""
    if text == "now":
        return "now"
    if text == "forever":
        return "forever"
    raise ValueError(f"--to must be now or forever, not {text!r}")


def parse_start(text: str) -> Start:
    """``--from``: beginning, now, or the path of a saved offsets file."""
    if text == "beginning":
        return "beginning"
    if text == "now":
        return "now"
    return Offsets.load(text)


def parse_vbuckets(spec: str | None) -> list[int] | None:
    """``0,1,5-9`` -> [0, 1, 5, 6, 7, 8, 9]; None or "" -> None (all)."""
    if not spec:
        return None
    out: set[int] = set()
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad vbucket range {part!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first > last:
            raise ValueError(f"bad vbucket range {part!r}")
        out.update(range(first, last + 1))
    return sorted(out)


def _value(value: bytes) -> tuple[str, bool]:
    try:
        return value.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(value).decode(), True


def event_record(ev: events.Event) -> dict[str, Any] | None:
    """The JSON object for an event, or None for events that are not printed."""
    if isinstance(ev, events.Mutation):
        value, b64 = _value(ev.value)
        key, key_b64 = _value(ev.key)
        rec: dict[str, Any] = {"op": "mutation", "vbucket": ev.vbucket, "seqno": ev.seqno,
                               "key": key, "value": value, "cas": ev.cas, "flags": ev.flags,
                               "expiry": ev.expiration, "rev_seqno": ev.rev_seqno}  # fmt: skip
        if b64:
            rec["value_base64"] = True
        if key_b64:
            rec["key_base64"] = True
        return rec
    if isinstance(ev, events.Deletion | events.Expiration):
        key, key_b64 = _value(ev.key)
        op = "deletion" if isinstance(ev, events.Deletion) else "expiration"
        rec = {"op": op, "vbucket": ev.vbucket, "seqno": ev.seqno, "key": key, "value": None,
               "cas": ev.cas, "flags": 0, "expiry": 0, "rev_seqno": ev.rev_seqno}  # fmt: skip
        if key_b64:
            rec["key_base64"] = True
        return rec
    if isinstance(ev, events.Rollback):
        return {"op": "rollback", "vbucket": ev.vbucket, "seqno": ev.rollback_seqno}
    return None


def line_of(ev: events.Event, fmt: str) -> bytes | None:
    """The output line of an event (without its newline), None for events not printed."""
    if fmt == "json" and type(ev) is events.Mutation:  # nearly every line: one dict, no copy
        try:
            key, value = ev.key.decode(), ev.value.decode()
        except UnicodeDecodeError:
            pass  # base64 somewhere: the general path below
        else:
            return orjson.dumps({"op": "mutation", "vbucket": ev.vbucket, "seqno": ev.seqno,
                                 "key": key, "value": value, "cas": ev.cas, "flags": ev.flags,
                                 "expiry": ev.expiration, "rev_seqno": ev.rev_seqno})  # fmt: skip
    rec = event_record(ev)
    return None if rec is None else format_line(rec, fmt)


def format_line(rec: dict[str, Any], fmt: str) -> bytes:
    """One output line (without its newline), UTF-8."""
    if fmt == "json":
        return orjson.dumps(rec)
    value = "" if rec.get("value") is None else str(rec["value"])
    if len(value) > 40:
        value = value[:37] + "..."
    line = f"{rec['op']:<10} {rec['vbucket']:>5} {rec['seqno']:>10}  {rec.get('key', '')}  {value}"
    return line.encode()


class LineWriter:
    """Lines gathered and written to a binary stream in blocks of ``WRITE_BYTES``, and
    whenever the stream task waits: the first line of a block schedules a write with
    ``call_soon``, which the loop runs only once the task is suspended (the consumer waits
    for the network), so a live stream's lines never sit in the buffer."""

    def __init__(
        self,
        out: IO[bytes],
        task: asyncio.Task[Any] | None = None,
        block: int = WRITE_BYTES,
    ) -> None:
        self.out, self.task, self.block = out, task, block
        self.lines: list[bytes] = []
        self.size = 0

    def write_line(self, line: bytes) -> None:
        if not self.lines and self.task is not None:
            self.task.get_loop().call_soon(self._flush_soon)
        self.lines.append(line)
        self.size += len(line) + 1
        if self.size >= self.block:
            self._write()

    def write_lines(self, lines: list[bytes | None]) -> int:
        """:meth:`write_line` for each line that is not None; how many were."""
        kept = [line for line in lines if line is not None]
        if kept and not self.lines and self.task is not None:
            self.task.get_loop().call_soon(self._flush_soon)
        self.lines += kept
        self.size += sum(map(len, kept)) + len(kept)
        if self.size >= self.block:
            self._write()
        return len(kept)

    def _write(self) -> None:
        if self.lines:
            self.lines.append(b"")  # the last line's newline
            self.out.write(b"\n".join(self.lines))
            self.lines, self.size = [], 0

    def flush(self) -> None:
        self._write()
        self.out.flush()

    def _flush_soon(self) -> None:
        try:
            self.flush()
        except OSError:  # the reader went away: stop the stream, whose last flush raises it
            assert self.task is not None
            self.task.cancel()


class Saver:
    """Saves offsets at most every N events or S seconds (and when told to)."""

    def __init__(self, path: Path | None, offsets: Callable[[], Offsets], out: LineWriter) -> None:
        self.path, self.offsets, self.out = path, offsets, out
        self.events = 0
        self.last = time.monotonic()

    def tick(self, n: int = 1) -> None:
        """``n`` more events were written out (the offsets are exactly after the last one)."""
        before, self.events = self.events, self.events + n
        if self.path is None:
            return
        crossed = self.events // SAVE_EVERY_EVENTS != before // SAVE_EVERY_EVENTS
        if crossed or time.monotonic() - self.last >= SAVE_EVERY_S:
            self.save()

    def save(self) -> None:
        self.out.flush()  # what the offsets claim must be out first
        if self.path is not None:
            self.offsets().save(self.path)
        self.last = time.monotonic()


async def run_stream(
    config: ClientSettings,
    vbuckets: list[int] | None,
    start: Start,
    end: End,
    save_path: Path | None,
    fmt: str,
    out: IO[bytes],
    progress: bool,
) -> int:
    consumer = Consumer(config)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    lines = LineWriter(out, task)
    saver = Saver(save_path, lambda: consumer.offsets, lines)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    bar = _Progress(consumer) if progress else None
    try:
        if bar is not None:
            await bar.start(vbuckets)
        chunks = consumer.stream_chunks(
            vbuckets, start=start, end=end, each=partial(line_of, fmt=fmt), most=CHUNK_EVENTS
        )
        async for chunk in chunks:
            printed = lines.write_lines(chunk)
            if bar is not None:
                bar.advance(printed)
            saver.tick(len(chunk))
    except asyncio.CancelledError:
        pass  # Ctrl-C / SIGTERM: save and exit 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        saver.save()
        if bar is not None:
            bar.stop()
        await consumer.close()
    return 0


class _Progress:
    """A rich progress bar on stderr: events/s and the lag (high seqnos minus offsets)."""

    def __init__(self, consumer: Consumer) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.consumer = consumer
        self.progress = Progress(
            TextColumn("[bold]stream"), BarColumn(), TextColumn("{task.completed} events"),
            TextColumn("{task.fields[rate]:.0f}/s"), TextColumn("lag {task.fields[lag]}"),
            TimeElapsedColumn(), console=Console(stderr=True), transient=False,
        )  # fmt: skip
        self.task = self.progress.add_task("stream", total=None, rate=0.0, lag="?")
        self.count = 0
        self.started = time.monotonic()
        self.highs: dict[int, int] = {}
        self.last_refresh = 0.0

    async def start(self, vbuckets: list[int] | None) -> None:
        seqnos = await self.consumer.vbucket_seqnos()
        wanted = set(vbuckets) if vbuckets is not None else set(seqnos)
        self.highs = {vb: high for vb, (_u, high) in seqnos.items() if vb in wanted}
        self.progress.start()

    def advance(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if now - self.last_refresh < 0.25:
            return
        self.last_refresh = now
        offsets = self.consumer.offsets
        lag = sum(max(0, h - offsets[vb].seqno) for vb, h in self.highs.items() if vb in offsets)
        rate = self.count / max(now - self.started, 1e-9)
        self.progress.update(self.task, completed=self.count, rate=rate, lag=lag)

    def stop(self) -> None:
        self.progress.update(self.task, completed=self.count)
        self.progress.stop()


def stream_main(
    config: ClientSettings,
    vbuckets: list[int] | None,
    start: Start,
    end: End,
    save_path: Path | None,
    fmt: str,
) -> int:
    progress = sys.stderr.isatty()
    return event_loop.run(
        run_stream(config, vbuckets, start, end, save_path, fmt, sys.stdout.buffer, progress)
    )


async def failover_logs(config: ClientSettings, vbuckets: list[int]) -> dict[int, list[Any]]:
    async with Consumer(config) as consumer:
        return {vb: list(await consumer.failover_log(vb)) for vb in vbuckets}

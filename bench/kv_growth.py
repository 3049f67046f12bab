"""A Set's cost as the bucket grows: one connection writing distinct keys, by segment.

Theory of operation
-------------------
``bench/kv.py`` writes 200,000 keys into an empty bucket, so it measures a bucket whose
storage trees still fit the flusher's page cache (16 MiB at most). A real bucket holds more,
and a flush's cost is in the pages it writes and reads back, not in its items: once the trees
outgrow the cache, pages come back from the OS and the write-ahead log's checkpoints copy more
of them. This benchmark shows where that knee is and how steep: against a fresh ``dcpkv
server`` (1,024 vbuckets, a quota of ``--quota-mb`` so nothing is ejected or refused), one
connection of ``bench/kv.py``'s client (batches of 100 pre-encoded Sets, the same 16-byte keys
and 100-byte values) writes ``--ops`` distinct keys in ``--segments`` equal segments; for each
segment it prints the acknowledged rate and the server's CPU per Set (all threads: event loop
and flusher). Acknowledgements follow the flusher, since write backpressure holds a writer
whose bucket's unpersisted lag passes 0.25 s, so the rate of a segment is the flusher's rate
at that size. At the end it waits until every write is persisted and reports the data
folder's size on disk. ``--keep DIR`` runs the server in ``DIR`` and leaves its bucket there
(``make bench``: 10M keys in 100 segments, the first at 100k keys and the last at 10M), for
``bench/large_bucket.py`` to restart without writing it again.

``--json PATH`` writes the rates and CPU costs at the start and the end of the growth
(``first_set_ops_per_s``, ``last_set_ops_per_s``, ``first_server_cpu_us_per_set``,
``last_server_cpu_us_per_set``): each the median of ``END_SEGMENTS`` segments, each segment
a round between yardstick samples (a segment of 100k Sets lasts about 2 s: too short for one
to stand for the rate). Then the disk bytes per item (``disk_bytes_per_key``), the Sets
refused and written again (``set_tmpfail_count``), the server's resident set at the end
(``server_rss_mib``), and every segment beside the figures.
``--before COMMIT`` (``bench/_before.py``) then runs that commit's own ``bench/kv_growth.py``
with ``--storage sqlite`` and the same options, in a detached worktree, in the same run: its
figures are kept as ``before_METRIC_sqlite`` and today's printed beside them as ratios. (The
SQLite flusher falls so far behind by 1M keys that its server refuses Sets, which are written
again: that run is long, and ``make bench`` leaves it out.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import kv
from _before import old_tree, run_old
from _report import a_round, bench_main, write_json
from _server import cpu_seconds, folder_bytes, rss_mib
from dcpkv.protocol.constants import Opcode

PERSIST_TIMEOUT_S = 300.0
RETRY_PAUSE_S = 0.05  # before writing again the Sets a segment had refused
KEEP_HELP = ("run the server in this new or empty folder and leave it there (its bucket in "
             "KEEP/data, every write persisted) for bench/large_bucket.py")  # fmt: skip
RETRY_TIMEOUT_S = 60.0  # a segment's refused Sets still refused this long: the quota is too small
END_SEGMENTS = 3  # the first and the last figures: the median of this many segments each


def end_segments(segments: int) -> dict[str, range]:
    """The segments the first and the last figures are the medians of."""
    count = max(1, min(END_SEGMENTS, segments // 2))
    return {"first": range(count), "last": range(segments - count, segments)}


async def grow(
    target: kv.Target, ops: int, segments: int, progress: Progress
) -> tuple[list[tuple[int, float, float]], int]:
    """(keys written so far, Sets/s, server CPU us per Set) per segment, after which every
    write is persisted; and the count of Etmpfail answers (each written again)."""
    conn = await kv.Conn.open(target)
    size = ops // segments
    out = []
    task = progress.add_task("Sets", total=size * segments)
    ends = end_segments(segments)
    try:
        for n in range(segments):
            work = kv.batches(Opcode.Set, range(n * size, (n + 1) * size), 100, target)
            names = [f"{end}_set_ops_per_s" for end, at in ends.items() if n in at]
            # the yardstick around the segments the figures are the medians of
            with a_round(wanted=bool(names)) as figures:
                cpu, start = cpu_seconds(target.pid), time.perf_counter()
                await conn.run(work)
                await _retry_tmpfail(conn, target)
                seconds, cpu = time.perf_counter() - start, cpu_seconds(target.pid) - cpu
                figures.update(dict.fromkeys(names, size / seconds))
            out.append(((n + 1) * size, size / seconds, cpu / size * 1e6))
            progress.advance(task, size)
        if conn.errors > len(conn.answers.tmpfail):
            raise RuntimeError(f"{conn.errors - len(conn.answers.tmpfail)} Sets failed")
        deadline = time.monotonic() + PERSIST_TIMEOUT_S
        while await kv.items_persisted(conn) < size * segments:
            if time.monotonic() > deadline:
                raise RuntimeError(f"writes not persisted within {PERSIST_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    return out, len(conn.answers.tmpfail)


async def _retry_tmpfail(conn: kv.Conn, target: kv.Target) -> None:
    """Write again, after a pause, the Sets the server refused with Etmpfail (its flusher
    behind: what an SDK does); each refusal stays counted in ``conn.answers.tmpfail``."""
    done, deadline = 0, time.monotonic() + RETRY_TIMEOUT_S
    while done < len(conn.answers.tmpfail):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Sets refused for {RETRY_TIMEOUT_S:.0f} s: raise --quota-mb")
        again = conn.answers.tmpfail[done:]
        done = len(conn.answers.tmpfail)
        await asyncio.sleep(RETRY_PAUSE_S)
        await conn.run(kv.batches(Opcode.Set, again, 100, target))


def _folder(keep: Path | None) -> contextlib.AbstractContextManager[str]:
    """The server's folder: ``keep`` (made empty, left behind) or a temporary one."""
    if keep is None:
        return tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR"))
    keep.mkdir(parents=True, exist_ok=True)
    if any(keep.iterdir()):
        raise typer.BadParameter(f"--keep {keep}: not empty")
    return contextlib.nullcontext(str(keep))


def run_one(
    ops: int, segments: int, quota_mb: int, console: Console, keep: Path | None = None
) -> dict:
    """One server: its segments, its figures (``keep``: the folder it ran in, left behind)."""
    with (
        _folder(keep) as tmp,
        kv.dcpkv_server(Path(tmp), quota_mb) as target,
        Progress(console=console, transient=True) as progress,
    ):
        rows, refused = asyncio.run(grow(target, ops, segments, progress))
        rss = rss_mib(target.pid)
        disk = folder_bytes(Path(tmp) / "data")
    table = Table(title=f"Set as the bucket grows (1 connection, {kv.VBUCKETS} vbuckets, "
                  f"{len(kv.VALUE)}-byte values)")  # fmt: skip
    for col in ("keys in the bucket", "Sets/s", "server CPU us/Set"):
        table.add_column(col, justify="right")
    for keys, rate, cpu in rows:
        table.add_row(f"{keys:,}", f"{rate:,.0f}", f"{cpu:.2f}")
    console.print(table)
    total = rows[-1][0]
    console.print(f"on disk when all was persisted: {disk / 1e6:.1f} MB, {disk / total:.0f} B/key; "
                  f"the server's RSS {rss:,.0f} MiB")  # fmt: skip
    if refused:
        console.print(f"Sets refused with Etmpfail and written again: {refused:,}")
    ends = end_segments(len(rows))
    first, last = ([rows[n] for n in ends[end]] for end in ("first", "last"))
    return {
        "rows": rows,
        "first_set_ops_per_s": statistics.median(row[1] for row in first),
        "last_set_ops_per_s": statistics.median(row[1] for row in last),
        "first_server_cpu_us_per_set": statistics.median(row[2] for row in first),
        "last_server_cpu_us_per_set": statistics.median(row[2] for row in last),
        "disk_bytes_per_key": disk / total,
        "server_rss_mib": rss,
        "set_tmpfail_count": refused,
    }


def main(
    ops: int = typer.Option(1_000_000, help="distinct keys written in all"),
    segments: int = typer.Option(10, help="segments the keys are written and measured in"),
    quota_mb: int = typer.Option(
        1536, help="the bucket's memory quota (~630 accounted bytes per key: none is ejected)"
    ),
    keep: Annotated[Path | None, typer.Option(help=KEEP_HELP)] = None,
    before: str | None = typer.Option(
        None, help="also run this commit's bench/kv_growth.py with its SQLite engine"
    ),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    if ops < segments or segments < 1:
        raise typer.BadParameter("--ops must be at least --segments, which is at least 1")
    console = Console()
    result = run_one(ops, segments, quota_mb, console, keep)
    rows = [list(r) for r in result.pop("rows")]
    figures: dict[str, float] = dict(result)
    with old_tree(before) as tree:
        if tree is not None:
            args = ["--ops", str(ops), "--segments", str(segments), "--quota-mb", str(quota_mb)]
            old = run_old(tree, "kv_growth.py", [*args, "--storage", "sqlite"])
            for name, value in result.items():
                theirs = old.get(f"before_{name}_sqlite")
                if theirs:
                    console.print(f"  {name}: today / sqlite {value / theirs:.2f}x")
            figures.update(old)
    write_json(json_out, "kv_growth", figures, segments=rows)


if __name__ == "__main__":
    bench_main(main)

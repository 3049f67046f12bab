"""The main job's live figures: the mirror's lag in seconds and its first batch's rate.

Theory of operation
-------------------
Runs ``dcpkv demo`` (a node with 1024 vbuckets, the sample data load, the live mirror and view
on Spark, a generator writing ``--rate`` changes per second) for ``--duration`` seconds into
a fresh data dir, then reads the mirror's ``_metrics.jsonl``:

* the first batch (the sample load, ``--docs`` documents): its rows per second of
  ``visible_s``, the time from the batch's start to the commit that makes its rows visible
  (the median of ``FIRST_BATCH_ROUNDS`` starts of the demo: the batch lasts about half a
  second, and one start's took 0.4-0.7 s on a quiet host, once 2.8 s; the starts after the
  first stop, as a user's Ctrl-C does, once their first batch is in).
  The demo writes a new mirror's first batch from the driver (``pipelines/first_batch.py``):
  its start is the load's first step, the question for the server's high seqnos, so it
  counts the planning, the read from the server, the Parquet write and the commit. (A first
  batch made by Spark starts when Spark hands it to the mirror's ``foreachBatch``, after the
  query's start and the batch's planning.) Not what runs after the commit (the view's batch).
  ``first_visible_after_start_s`` is the whole wait the user sees, from the command's start
  (node, sample load, the batch) to that commit;
* every later batch's ``lag_s`` (the demo's generator starts once the first batch is
  committed): seconds from the write of the batch's oldest change (its CAS)
  to the batch's commit, i.e. the longest any change of the batch waited to be visible in the
  mirror. p50 and p99 over the live batches (the last, catch-up batch after the stop
  included: the live query applies it before it is stopped): an upper bound on the
  per-change figure, since each change of a batch waited at most that long.

``--keep DIR`` keeps the data dir (metrics, logs) and ``demo.log`` there.

``--json PATH`` writes the figures for ``make bench``'s summary; the first batch's ratio to the
yardstick is the median of its rounds', each over a sample taken just before its command (the
batch commits a few seconds later; a sample then would time the demo's live phase).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _placement
from _report import a_round, bench_main, write_json

FIRST_BATCH_ROUNDS = 3
# the first batch's figures: the median of the rounds' (module docstring)
FIRST_FIGURES = ("first_batch_rows_per_s", "first_batch_visible_s", "first_visible_after_start_s")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(len(ordered), rank) - 1]


def main(
    rate: float = typer.Option(1000.0, "--rate", help="changes written per second"),
    duration: float = typer.Option(60.0, "--duration", help="seconds of the live phase"),
    docs: int = typer.Option(30_000, "--docs", help="sample documents loaded first"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
    keep: Annotated[
        Path | None, typer.Option("--keep", help="keep the data dir and demo.log here")
    ] = None,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dcpkv-bench-demo-"))
    try:
        print(f"demo bench: {docs:,} docs, then {rate:,.0f} changes/s for {duration:g} s")
        batches, started_at = _start(tmp, docs, rate, duration)
        figures = summarize(batches, started_at)
        firsts = [figures]
        for n in range(1, FIRST_BATCH_ROUNDS):  # more first batches: their median is the figure
            firsts.append(summarize(*_start(tmp / f"again{n}", docs, rate, 0.0)))
        for name in FIRST_FIGURES:
            figures[name] = statistics.median(f[name] for f in firsts)
        for name, value in figures.items():
            print(f"  {name:<28} {value:12,.2f}")
        write_json(json_out, "demo", figures, rate=rate, duration=duration, docs=docs)
    finally:
        if keep is not None:
            shutil.rmtree(keep, ignore_errors=True)
            shutil.move(tmp, keep)
        shutil.rmtree(tmp, ignore_errors=True)


def _start(
    folder: Path, docs: int, rate: float, duration: float
) -> tuple[list[dict[str, float]], float]:
    """One run of the demo in ``folder``: its mirror's batches and the time it started;
    ``duration`` 0: stopped (SIGINT, as a user's Ctrl-C) once the first batch is in."""
    cmd = [sys.executable, "-m", "dcpkv.cli.main", "demo", "--data-dir", str(folder / "data"),
           "--port", "0", "--docs", str(docs), "--rate", f"{rate:g}",
           "--duration", f"{duration or 3600:g}"]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    metrics = folder / "data" / "pipelines" / "mirror" / "_metrics.jsonl"
    started, started_at = time.perf_counter(), time.time()
    with open(folder / "demo.log", "wb") as log:
        # the yardstick just before the start (module docstring)
        with a_round(after=False) as first_round:
            with _placement.servers():  # the pipeline under test, node and Spark
                demo = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            _wait_first_batch(demo, metrics)
            if metrics.is_file():
                first = json.loads(metrics.read_text().splitlines()[0])
                first_round["first_batch_rows_per_s"] = _first_rate(first)
        if not duration:
            demo.send_signal(signal.SIGINT)
        code = demo.wait()
    print(f"  demo ran {time.perf_counter() - started:.0f} s, exit code {code}")
    if code or not metrics.is_file():
        sys.stdout.write((folder / "demo.log").read_text(errors="replace")[-3000:])
        raise SystemExit(f"the demo failed (exit {code})")
    return [json.loads(line) for line in metrics.read_text().splitlines() if line], started_at


def _wait_first_batch(demo: subprocess.Popen[bytes], metrics: Path) -> None:
    """Until the mirror's first batch is in its metrics file (or the demo has ended)."""
    while demo.poll() is None:
        if metrics.is_file() and "\n" in metrics.read_text():  # a whole line
            return
        time.sleep(0.1)


def _first_rate(first: dict[str, float]) -> float:
    return first["rows"] / max(float(first.get("visible_s") or first["seconds"]), 1e-9)


def summarize(batches: list[dict[str, float]], started_at: float) -> dict[str, float]:
    first, live = batches[0], batches[1:]
    lags = [float(b["lag_s"]) for b in live if b.get("lag_s") is not None]
    visible = float(first.get("visible_s") or first["seconds"])
    committed_at = first["finished_at"] - (first["seconds"] - visible)
    figures = {
        "first_batch_rows_per_s": _first_rate(first),
        "first_batch_visible_s": visible,
        "first_visible_after_start_s": committed_at - started_at,
        "live_batches": float(len(live)),
    }
    if lags:
        figures["lag_p50_s"] = percentile(lags, 50)
        figures["lag_p99_s"] = percentile(lags, 99)
    return figures


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    bench_main(main)

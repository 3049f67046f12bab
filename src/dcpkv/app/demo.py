"""The main job (``dcpkv demo``, ``make run``): one node, sample data, a mirror and a view.

Theory of operation
-------------------
The job runs in phases, each handing the next what it needs, and each undone in reverse
order however the job ends:

1. **Node.** A ``dcpkv server`` child process (:class:`~dcpkv.app.node.LocalNode`) on
   the embedded defaults, its data in the data dir. A taken port is reported, exit 1.
2. **Sample.** :func:`~dcpkv.pipelines.loader.load_sample` with a progress bar, unless the
   bucket's marker says the sample is already there (a re-run resumes, it does not reload).
3. **Pipelines.** A SparkSession (local, or ``--master``), then two streaming queries: the
   mirror (``<data>/pipelines/mirror``) and the ``revenue_by_country`` view of
   :mod:`~dcpkv.pipelines.example_views` (``<data>/pipelines/views``); a light
   :class:`~dcpkv.pipelines.loader.ChangeGenerator` keeps writing changes so data flows.
   Both queries keep their checkpoints under the data dir, so a re-run continues them.
4. **Live.** The main thread redraws one progress line from the queries' ``on_batch``
   callbacks (batches, rows/s, lag) and from a sampler thread that asks Spark, every few
   seconds, how many documents the mirror holds and how many groups the view has.
5. **Stop** (Ctrl-C, SIGTERM or ``--duration``): generator first, then the live queries, then
   one ``AvailableNow`` run of each pipeline, which catches up with everything the server
   holds at that moment (so the mirror ends equal to the bucket), then Spark, then the server
   (SIGTERM and its clean shutdown), and finally the metrics report PNG.

Signals: the first SIGINT/SIGTERM only sets an event; every phase looks at it between
steps (the load between chunks, the live loop every tick), so stopping is orderly. A second
one raises ``KeyboardInterrupt`` to skip the catch-up; the ``ExitStack`` still stops Spark
and the server. SparkContext installs its own SIGINT handler, so ours is installed again
once the session exists. The server is in its own process group and never sees the
terminal's Ctrl-C: it must outlive the queries that read from it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from dcpkv.app.node import LocalNode, NodeError
from dcpkv.client.settings import ConnectionSettings
from dcpkv.core.defaults import DEFAULT_PORT
from dcpkv.pipelines.loader import (
    ChangeGenerator,
    SampleInfo,
    bucket_vbuckets,
    load_sample,
    loaded_sample,
)

VIEW_NAME = "revenue_by_country"
VIEW_MAP = "dcpkv.pipelines.example_views:revenue_by_country"
VIEW_REDUCE = "sum"
SAMPLE_SEED = 42
TICK_S = 0.5
PLAIN_LINE_EVERY_S = 5.0  # without a terminal, the progress line is printed this often
SAMPLE_EVERY_S = 5.0
RATE_WINDOW_S = 10.0


@dataclass(frozen=True)
class DemoSettings:
    data_dir: Path = Path("./dcpkv-data")
    port: int = DEFAULT_PORT
    docs: int = 30_000
    duration: float | None = None
    master: str | None = None
    rate: float = 200.0
    vbuckets: int = 1024


@dataclass(frozen=True)
class DemoPaths:
    """Everything the job writes, under the data dir."""

    root: Path

    @property
    def pipelines(self) -> Path:
        return self.root / "pipelines"

    @property
    def mirror(self) -> Path:
        return self.pipelines / "mirror"

    @property
    def views(self) -> Path:
        return self.pipelines / "views"

    @property
    def view(self) -> Path:
        return self.views / VIEW_NAME

    @property
    def checkpoints(self) -> Path:
        return self.pipelines / "checkpoints"

    @property
    def server_log(self) -> Path:
        return self.pipelines / "logs" / "server.log"

    @property
    def report(self) -> Path:
        return self.pipelines / "report.png"


class Stopper:
    """First SIGINT/SIGTERM: set :attr:`event`. Second: ``KeyboardInterrupt``."""

    def __init__(self, console: Console) -> None:
        self.event = threading.Event()
        self.console = console
        self.forced = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.event.is_set():
            self.forced = True
            raise KeyboardInterrupt
        self.event.set()
        name = signal.Signals(signum).name
        self.console.print(f"[yellow]{name}: stopping cleanly (again to skip the catch-up)")

    @property
    def stopped(self) -> bool:
        return self.event.is_set()


@dataclass
class PipelineStats:
    """What the ``on_batch`` callbacks of one query told us (callbacks run on Spark's
    listener thread, hence the lock)."""

    batches: int = 0
    rows: int = 0
    lag: int | None = None
    lag_s: float | None = None  # the last batch's oldest change: write to commit (BatchStats)
    recent: deque[tuple[float, int]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_batch(self, stats: Any) -> None:
        now = time.monotonic()
        with self.lock:
            self.batches += 1
            self.rows += stats.rows
            self.lag = stats.lag
            self.lag_s = stats.lag_s
            self.recent.append((now, stats.rows))
            while self.recent and self.recent[0][0] < now - RATE_WINDOW_S:
                self.recent.popleft()

    def rate(self, since: float) -> float:
        now = time.monotonic()
        window = max(1.0, min(RATE_WINDOW_S, now - since))
        with self.lock:
            return sum(rows for at, rows in self.recent if at >= now - window) / window


@dataclass
class Sampled:
    docs: int | None = None
    groups: int | None = None


class RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f} docs/s", style="progress.data.speed")


def ensure_sample(
    ep: ConnectionSettings, num_vbuckets: int, docs: int, stopper: Stopper, console: Console
) -> SampleInfo | None:
    """The sample the bucket holds, loading it first when missing; None when stopped."""
    existing = loaded_sample(ep, num_vbuckets)
    if existing is not None:
        console.print(
            f"The bucket already holds the sample ({existing.docs:,} documents, seed "
            f"{existing.seed}): skipping the load; the pipelines resume where they stopped."
        )
        return existing
    columns = (
        SpinnerColumn(), TextColumn("[bold]Loading sample data"), BarColumn(),
        MofNCompleteColumn(), TextColumn("docs"), RateColumn(), TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("load", total=docs)
        done = load_sample(
            ep, num_vbuckets, docs, seed=SAMPLE_SEED,
            on_progress=lambda n: progress.advance(task, n), should_stop=lambda: stopper.stopped,
        )  # fmt: skip
    if not done:
        return None
    console.print(f"Loaded {docs:,} documents (customers, products, orders).")
    return SampleInfo(docs=docs, seed=SAMPLE_SEED)


def where_to_look(settings: DemoSettings, paths: DemoPaths, port: int, master: str) -> str:
    port_opt = "" if port == DEFAULT_PORT else f" --port {port}"
    views_opt = f" --views-dir {paths.views}"  # `dcpkv view`'s own default is elsewhere
    return "\n".join(
        [
            f"[bold green]dcpkv demo is running[/]: node 127.0.0.1:{port} (data in "
            f"{settings.data_dir}), Spark {master}, {settings.rate:.0f} changes/s written.",
            "[bold]Where to look[/] (from another terminal, while it runs):",
            f"  mirror   {paths.mirror}  (a versioned Parquet table of the documents; in",
            "           PySpark: dcpkv.pipelines.mirror.read_mirror(spark, path).show())",
            f"  view     dcpkv view query {VIEW_NAME} --group{views_opt}{port_opt}",
            f"  changes  dcpkv stream --to now{port_opt} | head",
            f"  stats    dcpkv stats{port_opt}   /   dcpkv stats dcp{port_opt}",
            f"  metrics  {paths.mirror}/_metrics.jsonl, {paths.view}/_metrics.jsonl",
            f"  report   dcpkv pipeline report {paths.mirror} {paths.view}  (also written at exit)",
            "Ctrl-C stops everything cleanly (a second Ctrl-C skips the final catch-up).",
        ]
    )


def run_demo(settings: DemoSettings, console: Console) -> int:
    """The whole job; the exit status."""
    paths = DemoPaths(settings.data_dir)
    stopper = Stopper(console)
    stopper.install()
    node = LocalNode(
        settings.data_dir, paths.server_log, port=settings.port, vbuckets=settings.vbuckets
    )
    with contextlib.ExitStack() as stack:
        try:
            port = node.start()
        except NodeError as exc:
            console.print(f"[red]dcpkv demo: cannot start the node: {exc}")
            return 1
        stack.callback(_stop_node, node, console)
        console.print(f"Node up: 127.0.0.1:{port} (pid {node.pid}), data in {settings.data_dir}")
        ep = ConnectionSettings.at(port=port)
        num_vbuckets, _items = bucket_vbuckets(ep)
        sample = ensure_sample(ep, num_vbuckets, settings.docs, stopper, console)
        if sample is None or stopper.stopped:
            return 0
        pipelines = _Pipelines.start(settings, paths, port, stopper, console, stack)
        if stopper.stopped:
            return 0
        generator = ChangeGenerator(
            ep, num_vbuckets, sample.docs, rate=settings.rate, seed=int(time.time())
        )
        generator.start()
        stack.callback(generator.stop)
        console.print(where_to_look(settings, paths, port, pipelines.master))
        started = time.monotonic()
        line = lambda: progress_line(started, pipelines, generator)  # noqa: E731
        _live(line, stopper, settings.duration, started, console, pipelines.queries)
        generator.stop()
        if generator.error is not None:
            console.print(f"[yellow]the change generator stopped early: {generator.error}")
        console.print(f"Stopped after {generator.written:,} changes. Catching up with the node...")
        pipelines.finish()
        console.print("Final: " + line())
    _write_report(paths, console)
    return 0


def _stop_node(node: LocalNode, console: Console) -> None:
    status = node.stop()
    console.print(f"Node stopped (pid {node.pid}, exit status {status}).")


class _Pipelines:
    """The mirror and the view: their Spark queries, stats and sampler."""

    def __init__(self, spark: Any, master: str, paths: DemoPaths, port: int) -> None:
        from dcpkv.pipelines.mirror import SourceSettings
        from dcpkv.pipelines.views import create_view

        self.spark = spark
        self.master = master
        self.paths = paths
        self.source = SourceSettings.at(port=port)
        create_view(paths.views, VIEW_NAME, VIEW_MAP, VIEW_REDUCE)
        self.mirror, self.view = PipelineStats(), PipelineStats()
        self.sampled = Sampled()
        self.queries: list[Any] = []
        self.sampler = _Sampler(self)

    @classmethod
    def start(
        cls, settings: DemoSettings, paths: DemoPaths, port: int, stopper: Stopper,
        console: Console, stack: contextlib.ExitStack,
    ) -> _Pipelines:  # fmt: skip
        from dcpkv.pipelines.spark_session import DEFAULT_MASTER, get_spark

        master = settings.master or DEFAULT_MASTER
        with console.status(f"Starting Spark ({master})..."):
            spark = get_spark("dcpkv-demo", settings.master)
        stack.callback(spark.stop)
        stopper.install()  # SparkContext replaced our SIGINT handler with its own
        pipelines = cls(spark, master, paths, port)
        stack.callback(pipelines.stop)
        pipelines.queries = pipelines.run(available_now=False)
        pipelines.sampler.start()
        return pipelines

    def run(self, available_now: bool) -> list[Any]:
        from dcpkv.pipelines.mirror import start_mirror
        from dcpkv.pipelines.views import start_view

        return [
            start_mirror(
                self.spark, self.source, self.paths.mirror,
                checkpoint=self.paths.checkpoints / "mirror", available_now=available_now,
                on_batch=self.mirror.on_batch,
            ),
            start_view(
                self.spark, self.paths.views, VIEW_NAME, self.source,
                available_now=available_now, on_batch=self.view.on_batch,
            ),
        ]  # fmt: skip

    def stop(self) -> None:
        from dcpkv.pipelines.mirror import stop_query

        self.sampler.stop()
        for query in self.queries:
            with contextlib.suppress(Exception):  # an already failed or stopped query
                stop_query(query)  # between batches: no Java trace, no half-written batch

    def finish(self) -> None:
        """Stop the live queries, then catch up once with everything the node holds now."""
        self.stop()
        for query in self.run(available_now=True):
            query.awaitTermination()
        self.sampled.docs, self.sampled.groups = self.sample_once()

    def sample_once(self) -> tuple[int | None, int | None]:
        from dcpkv.pipelines.mirror import read_mirror
        from dcpkv.pipelines.views import query_view

        docs = groups = None
        with contextlib.suppress(Exception):  # nothing written yet
            docs = read_mirror(self.spark, self.paths.mirror).count()
        with contextlib.suppress(Exception):  # no batch yet
            groups = len(query_view(None, self.paths.views, VIEW_NAME, group=True))
        return docs, groups


def progress_line(started: float, pipelines: _Pipelines, generator: ChangeGenerator) -> str:
    elapsed = int(time.monotonic() - started)
    mirror, view, sampled = pipelines.mirror, pipelines.view, pipelines.sampled
    lag = "-" if mirror.lag is None else f"{mirror.lag:,}"
    lag += "" if mirror.lag_s is None else f" ({mirror.lag_s:.1f} s)"
    docs = "-" if sampled.docs is None else f"{sampled.docs:,}"
    groups = "-" if sampled.groups is None else f"{sampled.groups}"
    return (
        f"{elapsed // 60:02d}:{elapsed % 60:02d}  mirror: {mirror.batches} batches, "
        f"{mirror.rate(started):,.0f} rows/s, lag {lag}, {docs} docs mirrored  |  "
        f"view: {view.batches} batches, {groups} groups  |  {generator.written:,} changes written"
    )


def _live(
    line: Callable[[], str], stopper: Stopper, duration: float | None, started: float,
    console: Console, queries: list[Any],
) -> None:  # fmt: skip
    """Redraw the progress line until a signal, the duration, or a query's failure."""
    deadline = None if duration is None else started + duration
    last_plain = started
    live = Live(Text(line()), console=console, transient=False) if console.is_terminal else None
    with live if live is not None else contextlib.nullcontext():
        while not stopper.event.wait(TICK_S):
            now = time.monotonic()
            if live is not None:
                live.update(Text(line()))
            elif now - last_plain >= PLAIN_LINE_EVERY_S:
                console.print(line())
                last_plain = now
            if deadline is not None and now >= deadline:
                return
            failed = [q for q in queries if not q.isActive]
            if failed:
                console.print(f"[red]a query stopped: {failed[0].exception()}")
                return


class _Sampler(threading.Thread):
    """Asks Spark every few seconds for the documents mirrored and the view's groups."""

    def __init__(self, pipelines: _Pipelines) -> None:
        super().__init__(name="dcpkv-demo-sampler", daemon=True)
        self.pipelines = pipelines
        self._stop_event = threading.Event()

    def run(self) -> None:
        sampled = self.pipelines.sampled
        while not self._stop_event.wait(SAMPLE_EVERY_S):
            docs, groups = self.pipelines.sample_once()
            sampled.docs = docs if docs is not None else sampled.docs
            sampled.groups = groups if groups is not None else sampled.groups

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(60)


def _write_report(paths: DemoPaths, console: Console) -> None:
    from dcpkv.pipelines.report import ReportError, draw_report

    dirs = [d for d in (paths.mirror, paths.view) if (d / "_metrics.jsonl").exists()]
    if not dirs:
        return
    try:
        out = draw_report(dirs, paths.report)
    except ReportError as exc:
        console.print(f"[yellow]no report: {exc}")
        return
    console.print(f"Report (throughput and lag over time): {out}")

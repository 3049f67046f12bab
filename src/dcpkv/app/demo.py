"""The main job (``dcpkv demo``, ``make run``): a node or a local cluster, sample data, a mirror
and a view, and at the end the check that both equal the bucket.

Theory of operation
-------------------
The job runs in phases, each handing the next what it needs, and each undone in reverse
order however the job ends:

The node back-ends are in ``demo_nodes.py``, the terminal (signals, the live line, the
progress bar's column) in ``demo_ui.py``.

1. **Node.** A ``dcpkv server`` child process (:class:`~dcpkv.app.node.LocalNode`) on
   the embedded defaults, its data in the data dir. A taken port is reported, exit 1.
   With ``--nodes N`` (N > 1) a local cluster instead (:class:`~dcpkv.cluster.local.
   LocalCluster`, what ``dcpkv cluster up`` runs: N managed nodes and the manager, under
   ``<data>/cluster``); every client (loader, generator, pipelines, end check) then gets the
   cluster's connection string and follows the map.
2. **Sample.** :func:`~dcpkv.pipelines.loader.load_sample` with a progress bar, unless the
   bucket's marker says the sample is already there (a re-run resumes, it does not reload).
   A new mirror's first batch (the sample) is written at once by the driver, without Spark
   (``pipelines/first_batch.py``): the mirror holds the bucket a fraction of a second after
   the load.
3. **Pipelines.** A SparkSession (local, or ``--master``), started in a thread
   (:class:`SparkStart`): for a mirror that has batches already from the job's first moment,
   beside the node's start and the sample's check; for a new mirror once its first batch is
   written (the JVM's start took the cores from the sample's load and the first batch:
   0.8-1.3 s instead of 0.3-0.4 s on two cores). Then it is warmed up on the node
   (``pipelines/warmup.py``: one small batch through the mirror's write path, so the Python
   workers and the JVM's first-job costs are paid before the live batches, not in them),
   and one streaming query starts from where the first batch ended: the mirror
   (``<data>/pipelines/mirror``), whose every batch also brings the ``revenue_by_country``
   view of :mod:`~dcpkv.pipelines.example_views` (``<data>/pipelines/views``) up to date
   from the rows it just committed (the view follows the mirror: one stream from the server
   and one batch's fixed cost, not two); a light
   :class:`~dcpkv.pipelines.loader.ChangeGenerator` keeps writing changes so data flows,
   from the moment the mirror holds the bucket as loaded and its query has run its first
   batch: the live phase, whose lag the bench measures, starts with a running query.
   The query keeps its checkpoint under the data dir, so a re-run continues it.
4. **Live.** The main thread redraws one progress line from the ``on_batch`` callbacks
   (batches, rows/s, lag) and from a sampler thread that reads, every few seconds and with
   pyarrow (no Spark job beside the batches'), how many documents the mirror holds and how
   many groups the view has.
   With ``--chaos`` (a cluster only) :class:`~dcpkv.app.chaos.Chaos` kills a random node
   every so often, waits for the auto-failover, restarts the node and takes it back with
   delta recovery; the live line counts the failovers.
5. **Stop** (Ctrl-C, SIGTERM or ``--duration``): chaos first (its running round ends, every
   node back), then the generator, then the live queries once they have caught up with what
   the server holds at that moment (up to :data:`DRAIN_S`), then one ``AvailableNow`` run of
   each pipeline for anything still missing, then the
   end check (:mod:`~dcpkv.app.endcheck`: the mirror and the view against the bucket; a
   difference is exit status 1), then Spark, then the nodes (SIGTERM and their clean
   shutdown), and finally the metrics report PNG, a dashed line at each failover.

Signals: the first SIGINT/SIGTERM only sets an event; every phase looks at it between
steps (the load between chunks, the live loop every tick), so stopping is orderly. A second
one raises ``KeyboardInterrupt`` to skip the catch-up; the ``ExitStack`` still stops Spark
and the server. SparkContext installs its own SIGINT handler, so ours is installed again
once the session exists. The server is in its own process group and never sees the
terminal's Ctrl-C: it must outlive the queries that read from it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeRemainingColumn,
)

from dcpkv.app.chaos import Chaos, ChaosSettings, Event
from dcpkv.app.demo_nodes import ClusterNodes, Nodes, OneNode
from dcpkv.app.demo_ui import PipelineStats, RateColumn, Sampled, Stopper, live_line, progress_line
from dcpkv.app.endcheck import end_check
from dcpkv.app.node import NodeStartError
from dcpkv.client.durability import parse_durability
from dcpkv.client.settings import ConnectionSettings
from dcpkv.cluster.admin_client import AdminError
from dcpkv.core.defaults import DEFAULT_PORT
from dcpkv.pipelines.first_batch import load_first_batch, new_mirror
from dcpkv.pipelines.loader import (
    ChangeGenerator,
    SampleInfo,
    load_sample,
    loaded_sample,
)
from dcpkv.pipelines.source_node import SourceSettings

VIEW_NAME = "revenue_by_country"
VIEW_MAP = "dcpkv.pipelines.example_views:revenue_by_country"
VIEW_REDUCE = "sum"
SAMPLE_SEED = 42
SAMPLE_EVERY_S = 5.0
SAMPLER_JOBS = "dcpkv-demo-sampler"  # the sampler's Spark job group
FIRST_BATCH_S = 300.0  # the longest the generator waits for the mirror's first batch
DRAIN_S = 30.0  # the longest a stop waits for the live query to catch up with the node


@dataclass(frozen=True)
class DemoSettings:
    data_dir: Path = Path("./dcpkv-data")
    port: int = DEFAULT_PORT
    docs: int = 30_000
    duration: float | None = None
    master: str | None = None
    rate: float = 200.0
    num_vbuckets: int = 1024
    nodes: int = 1
    replicas: int = 1
    chaos: ChaosSettings | None = None
    durability: str = "none"  # the loader's and the change generator's writes


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

    @property
    def cluster(self) -> Path:
        return self.root / "cluster"


def ensure_sample(
    ep: ConnectionSettings, num_vbuckets: int, docs: int, stopper: Stopper, console: Console,
    durability: str = "none",
) -> SampleInfo | None:  # fmt: skip
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
            durability=parse_durability(durability),
        )  # fmt: skip
    if not done:
        return None
    console.print(f"Loaded {docs:,} documents (customers, products, orders).")
    return SampleInfo(docs=docs, seed=SAMPLE_SEED)


def where_to_look(settings: DemoSettings, paths: DemoPaths, nodes: Nodes, master: str) -> str:
    opts = nodes.cli_options()
    views_opt = f" --views-dir {paths.views}"  # `dcpkv view`'s own default is elsewhere
    return "\n".join(
        [
            f"[bold green]dcpkv demo is running[/]: {nodes.describe()}, Spark {master}, "
            f"{settings.rate:.0f} changes/s written.",
            "[bold]Where to look[/] (from another terminal, while it runs):",
            f"  mirror   {paths.mirror}  (a versioned Parquet table of the documents; in",
            "           PySpark: dcpkv.pipelines.mirror.read_mirror(spark, path).show())",
            f"  view     dcpkv view query {VIEW_NAME} --group{views_opt}{opts}",
            f"  changes  dcpkv stream --to now{opts} | head",
            f"  stats    dcpkv stats{opts}   /   dcpkv stats dcp{opts}",
            *nodes.extra_help(),
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
    nodes: Nodes = (
        OneNode(settings.data_dir, paths.server_log, settings.port, settings.num_vbuckets)
        if settings.nodes == 1
        else ClusterNodes(paths.cluster, settings.nodes, settings.replicas, settings.num_vbuckets)
    )
    events: list[Event] = []
    with contextlib.ExitStack() as stack:
        stack.callback(nodes.stop, console)
        spark_start = SparkStart(settings.master, paths.pipelines / ".warmup")
        if not new_mirror(paths.mirror, paths.checkpoints / "mirror"):
            spark_start.start()  # beside the node's start and the sample's load
        stack.callback(spark_start.close)  # before the node stops: the warm-up reads from it
        try:
            ep = nodes.start(console)
        except NodeStartError as exc:
            console.print(f"[red]dcpkv demo: cannot start the node: {exc}")
            return 1
        code = _run(settings, paths, nodes, ep, stopper, console, stack, events, spark_start)
    _write_report(paths, console, events)
    return code


def _run(
    settings: DemoSettings, paths: DemoPaths, nodes: Nodes, ep: ConnectionSettings,
    stopper: Stopper, console: Console, stack: contextlib.ExitStack, events: list[Event],
    spark_start: SparkStart,
) -> int:  # fmt: skip
    """Sample, pipelines, generator (and chaos), live line, catch-up, end check."""
    num_vbuckets = nodes.num_vbuckets(ep)
    sample = ensure_sample(ep, num_vbuckets, settings.docs, stopper, console, settings.durability)
    if sample is None or stopper.stopped:
        return 0
    mirror_stats = PipelineStats()
    loaded = _load_first_batch(paths, SourceSettings(ep), mirror_stats, console)
    # Spark starts only now for a new mirror, and warms up only now in any case: the JVM's
    # start and the warm-up's job took the cores from the sample's load and the first batch
    # (a first batch visible in 0.8-1.3 s instead of 0.3-0.4 s on this 2-core machine).
    spark_start.node_ready(SourceSettings(ep), num_vbuckets)
    if spark_start.ident is None:
        spark_start.start()
    pipelines = _Pipelines.start(
        settings, paths, SourceSettings(ep), stopper, console, stack, spark_start, mirror_stats
    )
    if pipelines is None or stopper.stopped:
        return 0
    if not _first_batch(pipelines, stopper, console, loaded):
        return 0
    generator = ChangeGenerator(
        ep, num_vbuckets, sample.docs, rate=settings.rate, seed=int(time.time()),
        durability=parse_durability(settings.durability),
    )  # fmt: skip
    generator.start()
    stack.callback(generator.stop)
    chaos = _start_chaos(settings, nodes, console, stack, events)
    console.print(where_to_look(settings, paths, nodes, pipelines.master))
    started = time.monotonic()

    def line() -> str:
        m = pipelines
        chaos_line = None if chaos is None else chaos.summary()
        return progress_line(started, m.mirror, m.view, m.sampled, generator.written, chaos_line)

    live_line(line, stopper, settings.duration, started, console, pipelines.queries)
    if chaos is not None:
        _stop_chaos(chaos, console)
    generator.stop()
    if generator.error is not None:
        console.print(f"[yellow]the change generator stopped early: {generator.error}")
    console.print(f"Stopped after {generator.written:,} changes. Catching up with the node...")
    pipelines.finish()
    console.print("Final: " + line())
    check = end_check(
        pipelines.spark, pipelines.source, paths.mirror, paths.views, VIEW_NAME, VIEW_MAP
    )
    console.print(("[green]" if check.ok else "[red]") + check.line())
    return 0 if check.ok else 1


def _load_first_batch(
    paths: DemoPaths, source: SourceSettings, stats: PipelineStats, console: Console
) -> bool:
    """A new mirror's first batch (the sample), written by the driver the moment the sample
    is in, before Spark starts (``pipelines/first_batch.py``); False when the mirror is not
    new (a re-run) or the batch is left to Spark."""
    first = load_first_batch(
        paths.mirror, source, paths.checkpoints / "mirror", on_batch=stats.on_batch
    )
    if first is not None:
        console.print(
            f"Mirrored the bucket: {first.rows:,} changes visible in {first.visible_s or 0:.2f} s "
            "(the first batch, written without a Spark job)."
        )
    return first is not None


def _first_batch(pipelines: _Pipelines, stopper: Stopper, console: Console, loaded: bool) -> bool:
    """Wait for the mirror query's first batch (the sample, or what a re-run finds new)
    before the generator starts: the live phase, and its lag, begin once the mirror holds
    the bucket and its query runs. After a first batch the driver wrote (``loaded``) the
    query's own first batch (Spark runs one when a query starts afresh, even an empty one)
    says it runs. A re-run whose mirror already holds everything gets no batch: the wait ends
    when the mirror is caught up with the node (asked every second), or after
    :data:`FIRST_BATCH_S`. False when stopped first; a failed query is left to the live loop,
    which reports it."""
    deadline = time.monotonic() + FIRST_BATCH_S
    next_check = time.monotonic() + 1.0
    waiting = "Starting the mirror's query" if loaded else "Mirroring the bucket (the first batch)"
    with console.status(f"{waiting}..."):
        while pipelines.mirror.query_batches == 0 and not stopper.event.wait(0.1):
            now = time.monotonic()
            if now >= deadline or not all(q.isActive for q in pipelines.queries):
                return True
            if not loaded and now >= next_check:
                next_check = now + 1.0
                if pipelines.caught_up():
                    return True
    return not stopper.stopped


def _stop_chaos(chaos: Chaos, console: Console) -> None:
    """After its running round, every node back in: the catch-up reads a whole cluster."""
    console.print("Stopping the chaos (its running round ends first)...")
    chaos.stop()
    try:
        chaos.heal()
    except (AdminError, RuntimeError, OSError) as exc:  # the catch-up can still run
        console.print(f"[yellow]a node could not be brought back: {exc}")
    console.print(f"Chaos: {chaos.summary().removeprefix('chaos: ')}.")


def _start_chaos(
    settings: DemoSettings, nodes: Nodes, console: Console, stack: contextlib.ExitStack,
    events: list[Event],
) -> Chaos | None:  # fmt: skip
    if settings.chaos is None or not isinstance(nodes, ClusterNodes):
        return None

    def on_event(event: Event) -> None:
        events.append(event)
        console.print(f"[magenta]chaos[/] {event.line()}")

    chaos = Chaos(nodes.cluster, settings.chaos, on_event)
    chaos.switch_on()
    every = settings.chaos.every
    console.print(
        f"Chaos: a random node is killed every {every[0]:g}-{every[1]:g} s, failed over "
        f"automatically after {settings.chaos.failover_timeout_s} s, restarted and recovered "
        "(delta)."
    )
    chaos.start()
    stack.callback(chaos.cancel)  # a forced stop: no waiting for the round
    return chaos


class SparkStart(threading.Thread):
    """Starts the SparkSession, then warms it up on the node (``pipelines/warmup.py``), in a
    thread of its own, beside the main thread's work (the node's start and the sample's
    check, or the query's set-up): the first job's fixed costs are paid once the node is
    ready (:meth:`node_ready`), before the query starts, not in its batches. (SparkContext
    leaves the SIGINT handler alone outside the main thread, so the job's :class:`Stopper`
    stays in charge.)"""

    def __init__(self, master: str | None, scratch: Path) -> None:
        super().__init__(name="dcpkv-demo-spark-start", daemon=True)
        self.master = master
        self.scratch = scratch
        self.spark: Any = None
        self.error: BaseException | None = None
        self._node: tuple[SourceSettings, int] | None = None
        self._node_known = threading.Event()

    def node_ready(self, source: SourceSettings | None, num_vbuckets: int = 0) -> None:
        """The node answers (None: there will be none, skip the warm-up)."""
        self._node = None if source is None else (source, num_vbuckets)
        self._node_known.set()

    def run(self) -> None:
        from dcpkv.pipelines.spark_session import get_spark
        from dcpkv.pipelines.warmup import warm_up

        try:
            self.spark = get_spark("dcpkv-demo", self.master)
        except Exception as exc:  # handed to the main thread by session()
            self.error = exc
            return
        self._node_known.wait()
        if self._node is not None:
            # Best effort: a failed warm-up only leaves the costs to the query's first batches.
            with contextlib.suppress(Exception):
                warm_up(self.spark, self._node[0], self.scratch, self._node[1])

    def session(self, stopper: Stopper) -> Any:
        """The session once started and warmed up; None when stopped first."""
        while self.is_alive():
            if stopper.event.wait(0.1):
                return None
        if self.error is not None:
            raise self.error
        return self.spark

    def close(self) -> None:
        """Wait for the start (a JVM half started cannot be stopped) and stop the session."""
        if not self._node_known.is_set():
            self.node_ready(None)
        if self.ident is not None:  # started
            self.join()
        if self.spark is not None:
            self.spark.stop()


class _Pipelines:
    """The mirror and the view: their Spark queries, stats and sampler."""

    def __init__(
        self, spark: Any, master: str, paths: DemoPaths, source: SourceSettings,
        mirror: PipelineStats,
    ) -> None:  # fmt: skip
        from dcpkv.pipelines.views import create_view

        self.spark = spark
        self.master = master
        self.paths = paths
        self.source = source
        create_view(paths.views, VIEW_NAME, VIEW_MAP, VIEW_REDUCE)
        self.mirror, self.view = mirror, PipelineStats()
        self.sampled = Sampled()
        self.queries: list[Any] = []
        self.sampler = _Sampler(self)

    @classmethod
    def start(
        cls, settings: DemoSettings, paths: DemoPaths, source: SourceSettings,
        stopper: Stopper, console: Console, stack: contextlib.ExitStack, spark_start: SparkStart,
        mirror: PipelineStats,
    ) -> _Pipelines | None:  # fmt: skip
        """The queries on the session ``spark_start`` made (``mirror``: the mirror's stats,
        which may hold a first batch already); None when stopped first."""
        from dcpkv.pipelines.spark_session import DEFAULT_MASTER

        master = settings.master or DEFAULT_MASTER
        with console.status(f"Starting Spark ({master})..."):
            spark = spark_start.session(stopper)
        if spark is None:
            return None
        pipelines = cls(spark, master, paths, source, mirror)
        stack.callback(pipelines.stop)
        pipelines.queries = pipelines.run(available_now=False)
        pipelines.sampler.start()
        return pipelines

    def run(self, available_now: bool) -> list[Any]:
        """One query: the mirror, and the view applying each mirror batch right after its
        commit (one stream from the server, one set of Spark jobs per batch, not two)."""
        from dcpkv.pipelines.mirror import start_mirror
        from dcpkv.pipelines.views.job import view_follower

        view = view_follower(
            self.spark, self.paths.views, VIEW_NAME, self.paths.mirror, self.view.on_batch,
            background=not available_now,
        )  # fmt: skip
        return [
            start_mirror(
                self.spark, self.source, self.paths.mirror,
                checkpoint=self.paths.checkpoints / "mirror", available_now=available_now,
                on_batch=self.mirror.on_batch, after_commit=view.follow, on_stop=view.stop,
            ),
        ]  # fmt: skip

    def stop(self) -> None:
        from dcpkv.pipelines.table_job import stop_query

        self.sampler.stop()
        for query in self.queries:
            with contextlib.suppress(Exception):  # an already failed or stopped query
                stop_query(query)  # between batches: no Java trace, no half-written batch

    def finish(self) -> None:
        """Catch up with everything the node holds now, then stop. The live query does it
        (up to :data:`DRAIN_S`): its next batch is at most a trigger away, where a new
        query's start took seconds, which were the lag of the changes written just before the
        stop. Then the live queries stop, and one ``AvailableNow`` run applies whatever is
        still missing (usually nothing: it then runs no batch)."""
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and all(q.isActive for q in self.queries):
            if self.caught_up():
                break
            time.sleep(0.25)
        self.stop()
        for query in self.run(available_now=True):
            query.awaitTermination()
        self.sampled.docs, self.sampled.groups = self.sample_once()

    def caught_up(self) -> bool:
        """Whether the mirror has applied the node's high seqnos of now (False: not yet, or
        it cannot tell)."""
        from dcpkv.pipelines.mirror import mirror_manifest
        from dcpkv.pipelines.source_node import server_seqnos
        from dcpkv.pipelines.table_job import caught_up

        with contextlib.suppress(Exception):  # no manifest yet, a node not answering
            applied = mirror_manifest(self.paths.mirror).applied_seqnos()
            return bool(applied) and caught_up(applied, server_seqnos(self.source))
        return False

    def sample_once(self) -> tuple[int | None, int | None]:
        from dcpkv.pipelines.mirror import mirror_doc_count
        from dcpkv.pipelines.views import query_view

        docs = groups = None
        with contextlib.suppress(Exception):  # nothing written yet
            docs = mirror_doc_count(self.paths.mirror)  # pyarrow: no job beside the batches
        with contextlib.suppress(Exception):  # no batch yet
            groups = len(query_view(None, self.paths.views, VIEW_NAME, group=True))
        return docs, groups


class _Sampler(threading.Thread):
    """Asks Spark every few seconds for the documents mirrored and the view's groups."""

    def __init__(self, pipelines: _Pipelines) -> None:
        super().__init__(name="dcpkv-demo-sampler", daemon=True)
        self.pipelines = pipelines
        self._stop_event = threading.Event()

    def run(self) -> None:
        # Its Spark jobs in a group of their own, so stop() can cancel the one in flight
        # (PySpark pins this thread to a JVM thread, which carries the group).
        sc = self.pipelines.spark.sparkContext
        sc.setJobGroup(SAMPLER_JOBS, "the demo's sampler", interruptOnCancel=True)
        sampled = self.pipelines.sampled
        while not self._stop_event.wait(SAMPLE_EVERY_S):
            docs, groups = self.pipelines.sample_once()
            sampled.docs = docs if docs is not None else sampled.docs
            sampled.groups = groups if groups is not None else sampled.groups

    def stop(self) -> None:
        """Cancel the count in flight: behind the live batches it could take as long as
        they do, and the final catch-up would wait for it."""
        self._stop_event.set()
        if self.is_alive():
            with contextlib.suppress(Exception):  # Spark already stopped
                self.pipelines.spark.sparkContext.cancelJobGroup(SAMPLER_JOBS)
            self.join(60)


def _write_report(paths: DemoPaths, console: Console, events: list[Event]) -> None:
    from dcpkv.pipelines.report import ReportError, draw_report

    dirs = [d for d in (paths.mirror, paths.view) if (d / "_metrics.jsonl").exists()]
    if not dirs:
        return
    try:
        marks = [(e.at, f"failover {e.node}") for e in events if e.kind == "failover"]
        out = draw_report(dirs, paths.report, marks=marks)
    except ReportError as exc:
        console.print(f"[yellow]no report: {exc}")
        return
    console.print(f"Report (throughput and lag over time): {out}")

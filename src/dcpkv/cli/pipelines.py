"""``dcpkv pipeline mirror`` and ``dcpkv view create|run|query``: the Spark pipelines' CLI.

Theory of operation
-------------------
Thin shells over ``dcpkv.pipelines.mirror`` and ``dcpkv.pipelines.views``: each command that
runs a stream starts one SparkSession (:func:`~dcpkv.pipelines.spark_session.get_spark`:
``local[*]``, or ``--master``, e.g. a standalone cluster's ``spark://host:7077``), runs the
query until Ctrl-C (or until caught up with ``--once``), and stops the session. ``view query``
reads the view's files without Spark, so it answers in a fraction of a second.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from dcpkv.cli.options import (
    Bucket,
    Host,
    Master,
    Password,
    Port,
    Tls,
    TlsCa,
    User,
    connection_settings,
)
from dcpkv.core.defaults import (
    DEFAULT_BUCKET,
    DEFAULT_HOST,
    DEFAULT_PASSWORD,
    DEFAULT_PORT,
    DEFAULT_USER,
)

pipeline_app = typer.Typer(help="Spark pipelines over the change stream.", no_args_is_help=True)
view_app = typer.Typer(help="Incremental map/reduce views.", no_args_is_help=True)

Once = Annotated[bool, typer.Option("--once", help="Stop once caught up (AvailableNow).")]
MetricsPort = Annotated[
    int | None,
    typer.Option(
        help="Serve the job's Prometheus metrics (batches, rows, lag, rollback rows) on this "
        "port (0 picks a free one) [default: not served]."
    ),
]
MetricsHost = Annotated[str, typer.Option(help="The metrics port's address.")]
ViewsDir = Annotated[Path, typer.Option(help="Where views live.")]


def local_spark(master: str | None = None) -> Any:
    from dcpkv.pipelines.spark_session import get_spark

    return get_spark("dcpkv-pipeline", master)


def _run(query: Any, spark: Any) -> None:
    """Until the query ends (``--once``) or a signal. Our own handler, installed over
    SparkContext's (which cancels every job mid-write and raises inside a py4j call): the
    first SIGINT/SIGTERM stops the query between batches (``stop_query``), a second one
    interrupts."""
    from dcpkv.pipelines.table_job import stop_query

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        while query.isActive and not stop.wait(0.5):
            pass
        if stop.is_set():
            stop_query(query)
        else:
            query.awaitTermination()  # ended by itself: raises the query's error, if any
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()


def _print_batch(stats: Any) -> None:
    typer.echo(json.dumps(stats.__dict__))


def _on_batch(pipeline: str, port: int | None, host: str) -> Callable[[Any], None]:
    """Each batch printed, and added to the metrics when a port is given."""
    if port is None:
        return _print_batch
    from dcpkv.pipelines.metrics import PipelineMetrics

    metrics = PipelineMetrics(pipeline)
    bound = metrics.serve(host, port)
    typer.echo(f"metrics on http://{host}:{bound}/metrics", err=True)

    def both(stats: Any) -> None:
        _print_batch(stats)
        metrics.on_batch(stats)

    return both


@pipeline_app.command("mirror")
def mirror(
    to: Annotated[Path, typer.Option(help="The mirror's folder.")],
    once: Once = False,
    host: Host = DEFAULT_HOST,
    port: Port = DEFAULT_PORT,
    bucket: Bucket = DEFAULT_BUCKET,
    user: User = DEFAULT_USER,
    password: Password = DEFAULT_PASSWORD,
    tls: Tls = False,
    tls_ca: TlsCa = None,
    vbuckets: Annotated[str | None, typer.Option(help="vbuckets, e.g. 0-7.")] = None,
    max_changes: Annotated[int | None, typer.Option(help="Changes per batch at most.")] = None,
    master: Master = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = "127.0.0.1",
) -> None:
    """Keep a Parquet table of the bucket's current documents (read it with read_mirror)."""
    from dcpkv.pipelines.mirror import start_mirror
    from dcpkv.pipelines.source_node import SourceSettings

    source = SourceSettings(
        connection_settings(host, port, bucket, user, password, tls, tls_ca), vbuckets, max_changes
    )
    on_batch = _on_batch("mirror", metrics_port, metrics_host)
    spark = local_spark(master)
    _run(start_mirror(spark, source, to, available_now=once, on_batch=on_batch), spark)


@view_app.command("create")
def create(
    name: str,
    map_: Annotated[str, typer.Option("--map", help="module:function")],
    reduce: Annotated[str | None, typer.Option(help="count, sum, stats or module:function")] = None,
    views_dir: ViewsDir = Path("./dcpkv-views"),
) -> None:
    """Define a view."""
    from dcpkv.pipelines.views import ViewError, create_view

    try:
        create_view(views_dir, name, map_, reduce)
    except ViewError as exc:
        typer.echo(f"dcpkv view create: {exc}", err=True)
        raise typer.Exit(2) from None


@view_app.command("run")
def run(
    name: str,
    once: Once = False,
    views_dir: ViewsDir = Path("./dcpkv-views"),
    mirror: Annotated[Path | None, typer.Option(help="Follow this mirror instead.")] = None,
    host: Host = DEFAULT_HOST,
    port: Port = DEFAULT_PORT,
    bucket: Bucket = DEFAULT_BUCKET,
    user: User = DEFAULT_USER,
    password: Password = DEFAULT_PASSWORD,
    tls: Tls = False,
    tls_ca: TlsCa = None,
    master: Master = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = "127.0.0.1",
) -> None:
    """Keep a view up to date from the server (or a mirror)."""
    from dcpkv.pipelines.source_node import SourceSettings
    from dcpkv.pipelines.views import start_view

    source = mirror or SourceSettings(
        connection_settings(host, port, bucket, user, password, tls, tls_ca)
    )
    on_batch = _on_batch(f"view:{name}", metrics_port, metrics_host)
    spark = local_spark(master)
    query = start_view(spark, views_dir, name, source, available_now=once, on_batch=on_batch)
    _run(query, spark)


@view_app.command("query")
def query(
    name: str,
    key: Annotated[str | None, typer.Option(help="An emit key, as JSON.")] = None,
    range_: Annotated[
        tuple[str, str] | None, typer.Option("--range", help="Two emit keys (JSON), inclusive.")
    ] = None,
    group: Annotated[bool, typer.Option("--group", help="Reduce per emit key.")] = False,
    stale: Annotated[str, typer.Option(help="ok, or false: wait for the server's changes.")] = "ok",
    timeout: Annotated[float, typer.Option(help="stale=false: seconds at most.")] = 60.0,
    views_dir: ViewsDir = Path("./dcpkv-views"),
    host: Host = DEFAULT_HOST,
    port: Port = DEFAULT_PORT,
    bucket: Bucket = DEFAULT_BUCKET,
    user: User = DEFAULT_USER,
    password: Password = DEFAULT_PASSWORD,
    tls: Tls = False,
    tls_ca: TlsCa = None,
) -> None:
    """Query a view; one JSON row per line."""
    from dcpkv.pipelines.source_node import SourceSettings
    from dcpkv.pipelines.views import ViewError, query_view

    source = SourceSettings(connection_settings(host, port, bucket, user, password, tls, tls_ca))
    try:
        rows = query_view(
            None,
            views_dir,
            name,
            key=None if key is None else _json(key),
            range=None if range_ is None else (_json(range_[0]), _json(range_[1])),
            group=group,
            stale=stale,
            source=source,
            timeout=timeout,
        )
    except (ViewError, TimeoutError, OSError) as exc:
        typer.echo(f"dcpkv view query: {exc}", err=True)
        raise typer.Exit(1) from None
    for row in rows:
        typer.echo(json.dumps(row))


def _json(text: str) -> Any:
    """A JSON value, or the text itself as a string (``--key France``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text

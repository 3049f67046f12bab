"""`dcpkv`: one command, one subcommand per job."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from dcpkv.cli.demo import demo as demo_command
from dcpkv.cli.demo import report as report_command
from dcpkv.cli.options import (
    Bucket,
    Host,
    LogFormat,
    LogLevel,
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

app = typer.Typer(
    name="dcpkv",
    help="dcpkv: a partitioned key-value store with a correct, resumable change stream (DCP).",
    no_args_is_help=True,
    add_completion=False,
    # Markdown: docstring paragraphs are re-flowed to the terminal instead of keeping the
    # source's line breaks.
    rich_markup_mode="markdown",
)
app.command()(demo_command)


@app.callback()
def _root() -> None:
    """dcpkv: a partitioned key-value store with a correct, resumable change stream (DCP)."""


@app.command()
def server(
    host: Annotated[
        str | None, typer.Option(help="Address to listen on [default: 127.0.0.1].")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port; 0 picks a free one [default: 11210].")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Where buckets live [default: ./dcpkv-data].")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="A TOML config file (flags override it).")
    ] = None,
    bucket: Annotated[
        str | None, typer.Option(help="Name of the (first) bucket [default: default].")
    ] = None,
    vbuckets: Annotated[
        int | None, typer.Option(help="vbuckets of that bucket [default: 1024].")
    ] = None,
    memory_quota_mb: Annotated[
        int | None, typer.Option(help="Its memory quota [default: 256].")
    ] = None,
    eviction_policy: Annotated[
        str | None,
        typer.Option(
            help="What leaves memory over the quota: valueOnly (persisted values; every key "
            "stays) or fullEviction (whole persisted items: the bucket may outgrow memory) "
            "[default: valueOnly]."
        ),
    ] = None,
    compression_mode: Annotated[
        str | None,
        typer.Option(help="Its Snappy mode: off, passive or active [default: passive]."),
    ] = None,
    durability_min_level: Annotated[
        str | None,
        typer.Option(
            help="Its minimum durability level: none, majority, majorityAndPersistActive or "
            "persistToMajority; every write becomes a SyncWrite of at least that level "
            "[default: none]."
        ),
    ] = None,
    durability_timeout_ms: Annotated[
        int | None,
        typer.Option(help="Its durable writes' timeout when they name none [default: 30000]."),
    ] = None,
    conflict_resolution: Annotated[
        str | None,
        typer.Option(
            help="How its XDCR (with-meta) writes are judged: seqno (revision) or lww "
            "(timestamp); fixed when the bucket is created [default: seqno]."
        ),
    ] = None,
    user: Annotated[str | None, typer.Option(help="The one user [default: Administrator].")] = None,
    password: Annotated[str | None, typer.Option(help="Its password [default: password].")] = None,
    port_file: Annotated[
        Path | None, typer.Option(help="Write the bound port here once listening.")
    ] = None,
    flush_interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds between flusher runs [default: 0.05]. A huge value keeps writes in "
            "memory only (the crash tests use it to lose unpersisted writes on kill -9)."
        ),
    ] = None,
    tls_port: Annotated[
        int | None,
        typer.Option(help="Also listen with TLS on this port (Couchbase uses 11207; 0: free)."),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="The TLS certificate chain (PEM), with --tls-port.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Its private key (PEM).")] = None,
    tls_ca: Annotated[
        Path | None,
        typer.Option(help="Require TLS clients to present a certificate signed by this CA."),
    ] = None,
    managed: Annotated[
        bool,
        typer.Option(
            "--managed",
            help="A node of a cluster: a new bucket starts with no vbuckets, and the cluster "
            "manager sets their states and the cluster map (without it, one node is the whole "
            "cluster and holds every vbucket active).",
        ),
    ] = False,
    max_connections: Annotated[
        int | None,
        typer.Option(help="Connections served at once; more are closed [default: 4096]."),
    ] = None,
    unauth_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds a connection may stay without logging in [default: 30]."),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus metrics over HTTP on this port (0 picks a free one) "
            "[default: not served]."
        ),
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(help="The metrics port's address [default: 127.0.0.1, loopback only]."),
    ] = None,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Run the key-value data server until SIGINT/SIGTERM."""
    from dcpkv.core import logs
    from dcpkv.server.app import run
    from dcpkv.server.config import ConfigError, load_config, with_cli_flags

    try:
        logs.check(log_level, log_format)
        settings = with_cli_flags(
            load_config(config),
            host=host,
            port=port,
            data_dir=data_dir,
            bucket=bucket,
            vbuckets=vbuckets,
            memory_quota_mb=memory_quota_mb,
            eviction_policy=eviction_policy,
            compression_mode=compression_mode,
            durability_min_level=durability_min_level,
            durability_timeout_ms=durability_timeout_ms,
            conflict_resolution=conflict_resolution,
            user=user,
            password=password,
            flush_interval_s=flush_interval,
            managed=managed or None,
            tls_port=tls_port,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_ca=tls_ca,
            max_connections=max_connections,
            unauth_idle_timeout_s=unauth_timeout,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
    except (ConfigError, logs.LogSettingsError) as exc:
        typer.echo(f"dcpkv server: {exc}", err=True)
        raise typer.Exit(2) from None
    from dcpkv.cli.admin import migrate_buckets
    from dcpkv.core.tls import TlsError
    from dcpkv.engine.bucket import ConflictModeMismatch
    from dcpkv.engine.storage import StorageError

    try:
        # Buckets the SQLite engine wrote are converted here, under a progress bar (the
        # server would convert them too, logging its progress).
        migrate_buckets(Path(settings.data_dir), [b.name for b in settings.buckets])
        run(settings, port_file, log_level=log_level, log_format=log_format)
    except (OSError, StorageError, TlsError, ConflictModeMismatch) as exc:
        typer.echo(f"dcpkv server: cannot start: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def compact(
    data_dir: Annotated[Path, typer.Option(help="The server's data folder.")] = Path(
        "./dcpkv-data"
    ),
    bucket: Annotated[str, typer.Option(help="Bucket to compact.")] = "default",
    vbucket: Annotated[
        int | None, typer.Option(help="Only this vbucket [default: every vbucket].")
    ] = None,
    purge_before_seqno: Annotated[
        int | None, typer.Option(help="Purge tombstones with a seqno below this.")
    ] = None,
    older_than: Annotated[
        float | None, typer.Option(help="Purge tombstones deleted more than SECONDS ago.")
    ] = None,
) -> None:
    """Purge tombstones of a stopped server's bucket, raising its purge seqnos.

    A running server compacts by itself (tombstones older than three days, every hour). This
    command is for a stopped one: it refuses to touch a bucket a server holds. DCP consumers
    that resume from below a vbucket's new purge seqno are rolled back to zero, since they may
    have missed deletions that no longer exist.
    """
    from dcpkv.cli.admin import migrate_buckets, sqlite_buckets
    from dcpkv.engine.bucket import Bucket, storage_path
    from dcpkv.engine.storage import BucketLock, StorageError

    if (purge_before_seqno is None) == (older_than is None):
        typer.echo("dcpkv compact: give one of --purge-before-seqno or --older-than", err=True)
        raise typer.Exit(2)
    if not storage_path(data_dir, bucket).exists() and bucket not in sqlite_buckets(data_dir):
        typer.echo(f"dcpkv compact: no bucket {bucket!r} in {data_dir}", err=True)
        raise typer.Exit(1)
    try:
        migrate_buckets(data_dir, [bucket])  # (one the SQLite engine wrote: as a start would)
        lock = BucketLock(data_dir, bucket)
        try:
            with Bucket(bucket, data_dir) as opened:
                if vbucket is not None and vbucket not in opened.vbuckets:
                    typer.echo(f"dcpkv compact: bucket has no vbucket {vbucket}", err=True)
                    raise typer.Exit(1)
                results = opened.compact(
                    vbucket, purge_before_seqno=purge_before_seqno, purge_older_than_secs=older_than
                )
        finally:
            lock.release()
    except StorageError as exc:
        typer.echo(f"dcpkv compact: {exc}", err=True)
        raise typer.Exit(1) from None
    purged = sum(r.purged for r in results.values())
    typer.echo(
        f"compacted {len(results)} vbucket(s) of {bucket!r}: {purged} tombstone(s) purged, "
        f"highest purge seqno {max((r.purge_seqno for r in results.values()), default=0)}"
    )


def format_table(rows: list[tuple[str, str]]) -> str:
    """Two left-aligned columns, the first as wide as its longest name."""
    if not rows:
        return ""
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


@app.command()
def stats(
    group: Annotated[
        str, typer.Argument(help="Stat group: '' (general), dcp, vbucket-seqno, failovers...")
    ] = "",
    host: Host = DEFAULT_HOST,
    port: Port = DEFAULT_PORT,
    user: User = DEFAULT_USER,
    password: Password = DEFAULT_PASSWORD,
    bucket: Bucket = DEFAULT_BUCKET,
    tls: Tls = False,
    tls_ca: TlsCa = None,
) -> None:
    """Print a running server's stats of one group as a table."""
    from dcpkv.client.blocking import BlockingKV, RequestFailed
    from dcpkv.client.settings import NodeAddressError
    from dcpkv.core.tls import TlsError

    try:
        settings = connection_settings(host, port, bucket, user, password, tls, tls_ca)
        with BlockingKV.connect(settings) as session:
            rows = session.stats(group)
    except (OSError, RequestFailed, NodeAddressError, TlsError) as exc:
        typer.echo(f"dcpkv stats: {exc}", err=True)
        raise typer.Exit(1) from None
    if rows:
        typer.echo(format_table(rows))


@app.command()
def stream(
    host: Host = DEFAULT_HOST,
    port: Port = DEFAULT_PORT,
    bucket: Bucket = DEFAULT_BUCKET,
    user: User = DEFAULT_USER,
    password: Password = DEFAULT_PASSWORD,
    vbuckets: Annotated[
        str | None, typer.Option(help="vbuckets, e.g. 0,1,5-9 [default: all].")
    ] = None,
    from_: Annotated[
        str, typer.Option("--from", help="beginning, now, or a saved offsets FILE.")
    ] = "beginning",
    to: Annotated[str, typer.Option(help="now (the high seqnos at start) or forever.")] = "forever",
    save_offsets: Annotated[
        Path | None, typer.Option(help="Save offsets here (atomically, periodically, at exit).")
    ] = None,
    format_: Annotated[str, typer.Option("--format", help="json (lines) or table.")] = "json",
    name: Annotated[str, typer.Option(help="DCP connection name.")] = "dcpkv-stream",
    tls: Tls = False,
    tls_ca: TlsCa = None,
) -> None:
    """Print a bucket's changes (DCP), resumable from saved offsets.

    One line per mutation, deletion, expiration or rollback (JSON: op, vbucket, seqno, key,
    value as UTF-8 or base64 with value_base64, cas, flags, expiry, rev_seqno). Ctrl-C saves
    the offsets and exits 0.
    """
    from dcpkv.cli.stream import parse_end, parse_start, parse_vbuckets, stream_main
    from dcpkv.client.connection import ClientError
    from dcpkv.client.offsets import OffsetsFileError
    from dcpkv.client.settings import ClientSettings
    from dcpkv.core.tls import TlsError

    try:
        vbs = parse_vbuckets(vbuckets)
        end = parse_end(to)
        if format_ not in ("json", "table"):
            raise ValueError(f"--format must be json or table, not {format_!r}")
        start = parse_start(from_)
        connection = connection_settings(host, port, bucket, user, password, tls, tls_ca)
    except (ValueError, OffsetsFileError) as exc:
        typer.echo(f"dcpkv stream: {exc}", err=True)
        raise typer.Exit(2) from None
    config = ClientSettings(connection, name=name)
    try:
        code = stream_main(config, vbs, start, end, save_offsets, format_)
    except BrokenPipeError:  # the reader went away (| head): not an error
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except (OSError, ClientError, TlsError) as exc:
        typer.echo(f"dcpkv stream: {exc}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@app.command("failover-log")
def failover_log(
    vbuckets: Annotated[list[int], typer.Argument(help="vbucket ids.")],
    host: Host = DEFAULT_HOST,
    port: Port = DEFAULT_PORT,
    bucket: Bucket = DEFAULT_BUCKET,
    user: User = DEFAULT_USER,
    password: Password = DEFAULT_PASSWORD,
    json_: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    tls: Tls = False,
    tls_ca: TlsCa = None,
) -> None:
    """Print the failover log (newest entry first) of each vbucket."""
    import asyncio
    import json

    from dcpkv.cli.stream import failover_logs
    from dcpkv.client.connection import ClientError
    from dcpkv.client.settings import ClientSettings
    from dcpkv.core.tls import TlsError

    config = ClientSettings(connection_settings(host, port, bucket, user, password, tls, tls_ca))
    try:
        logs = asyncio.run(failover_logs(config, vbuckets))
    except (OSError, ClientError, TlsError) as exc:
        typer.echo(f"dcpkv failover-log: {exc}", err=True)
        raise typer.Exit(1) from None
    if json_:
        doc = {
            str(vb): [{"uuid": e.uuid, "seqno": e.seqno} for e in log] for vb, log in logs.items()
        }
        typer.echo(json.dumps(doc))
        return
    typer.echo(f"{'vbucket':>7}  {'#':>3}  {'uuid':>20}  {'seqno':>12}")
    for vb, log in logs.items():
        for i, entry in enumerate(log):
            typer.echo(f"{vb:>7}  {i:>3}  {entry.uuid:>20}  {entry.seqno:>12}")


from dcpkv.cli.pipelines import pipeline_app, view_app  # noqa: E402

app.add_typer(pipeline_app, name="pipeline")
app.add_typer(view_app, name="view")
pipeline_app.command()(report_command)

from dcpkv.cli.backup import register as _register_backup  # noqa: E402

_register_backup(app)

from dcpkv.cli.cluster import register as _register_cluster  # noqa: E402

_register_cluster(app)

from dcpkv.cli.admin import register as _register_admin  # noqa: E402
from dcpkv.cli.users import user_app  # noqa: E402
from dcpkv.cli.xdcr import xdcr_app  # noqa: E402

app.add_typer(xdcr_app, name="xdcr")

_register_admin(app)

app.add_typer(user_app, name="user")

if __name__ == "__main__":
    app()

"""``dcpkv admin``: maintenance of a stopped server's data folder (``migrate``).

Theory of operation
-------------------
A thin shell over :func:`dcpkv.engine.bucket.migrate_storage` (the steps and their crash
safety are :mod:`dcpkv.engine.migrate`'s). ``migrate`` converts the buckets that the SQLite
engine of earlier versions wrote to RocksDB, the one storage engine, holding each bucket's
lock (a running server holds it: the command then refuses that bucket), with a progress bar
on stderr when stderr is a terminal.
``dcpkv server`` converts its own buckets the same way before it starts
(:func:`migrate_buckets`). Errors print one line and exit 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

admin_app = typer.Typer(
    help="Maintenance of a stopped server's data folder.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)


def register(app: typer.Typer) -> None:
    """Add ``admin`` to the root command."""
    app.add_typer(admin_app, name="admin")


def sqlite_buckets(data_dir: Path) -> list[str]:
    """The buckets in ``data_dir`` that the SQLite engine wrote."""
    from dcpkv.engine.sqlite_reader import SUFFIX

    if not data_dir.is_dir():
        return []
    return sorted(p.name[: -len(SUFFIX)] for p in data_dir.glob(f"*{SUFFIX}"))


def migrate_buckets(data_dir: Path, buckets: list[str]) -> list[tuple[str, int]]:
    """Convert those of ``buckets`` that SQLite wrote, each under its lock and a progress bar;
    returns (bucket, versions written) for each converted. Raises StorageError."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    from dcpkv.engine.bucket import migrate_storage
    from dcpkv.engine.storage import BucketLock

    todo = [b for b in buckets if b in sqlite_buckets(data_dir)]
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    done: list[tuple[str, int]] = []
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        for bucket in todo:
            task = progress.add_task(f"converting {bucket} to RocksDB", total=None)

            def on_progress(written: int, total: int, task: TaskID = task) -> None:
                progress.update(task, completed=written, total=total)

            lock = BucketLock(data_dir, bucket)
            try:
                done.append((bucket, migrate_storage(data_dir, bucket, progress=on_progress)))
            finally:
                lock.release()
    return done


@admin_app.command()
def migrate(
    data_dir: Annotated[Path, typer.Option(help="The server's data folder.")] = Path(
        "./dcpkv-data"
    ),
    bucket: Annotated[
        list[str] | None,
        typer.Option(help="Convert this bucket (repeatable) [default: every SQLite bucket]."),
    ] = None,
) -> None:
    """Convert a stopped server's buckets from the SQLite engine to RocksDB.

    Everything is carried over (documents, tombstones, pending prepares, vbucket states,
    failover logs, the history and flush points rollback needs). The SQLite files are removed
    only once the RocksDB copy is complete; a conversion interrupted by a crash starts again
    from them at the next run (or server start). A server converts its buckets by itself when
    it starts: this command does it ahead of time, with a progress bar.
    """
    from dcpkv.engine.storage import StorageError

    names = bucket or sqlite_buckets(data_dir)
    missing = [b for b in names if b not in sqlite_buckets(data_dir)]
    if missing:
        typer.echo(f"dcpkv admin migrate: no SQLite bucket {missing[0]!r} in {data_dir}", err=True)
        raise typer.Exit(1)
    if not names:
        typer.echo(f"nothing to convert: no SQLite bucket in {data_dir}")
        return
    try:
        converted = migrate_buckets(data_dir, names)
    except StorageError as exc:
        typer.echo(f"dcpkv admin migrate: {exc}", err=True)
        raise typer.Exit(1) from None
    for name, written in converted:
        typer.echo(f"bucket {name!r}: converted to RocksDB ({written} versions)")

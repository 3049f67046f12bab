"""``dcpkv backup`` (run, ``list``, ``verify``) and ``dcpkv restore``: incremental backups.

Theory of operation
-------------------
A thin shell over ``dcpkv.pipelines.backup`` (the Spark jobs) and
``dcpkv.pipelines.backup_layout`` (the folder, manifests, verification). ``backup`` with no
subcommand runs one backup into ``--to``; ``list`` and ``verify`` read the folder only (no
Spark, no server). The jobs start a local SparkSession through
``dcpkv.pipelines.spark_session.get_spark``. Heavy imports (Spark, the pipelines) happen inside
the commands so that ``dcpkv --help`` stays fast. A progress bar on stderr follows the phases
of a job when stderr is a terminal. Errors print one line and exit 1; ``verify`` exits 1 with
one line per problem.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from dcpkv.cli.options import (
    Bucket,
    DurabilityLevel,
    Host,
    Master,
    Password,
    Port,
    Tls,
    TlsCa,
    User,
    connection_settings,
    durability_level,
)
from dcpkv.core.defaults import (
    DEFAULT_BUCKET,
    DEFAULT_HOST,
    DEFAULT_PASSWORD,
    DEFAULT_PORT,
    DEFAULT_USER,
)

backup_app = typer.Typer(
    help="Incremental backups of a bucket (Spark jobs over the change stream).",
    add_completion=False,
    rich_markup_mode="markdown",
)

From = Annotated[Path, typer.Option("--from", help="The backup folder.")]


def register(app: typer.Typer) -> None:
    """Add ``backup`` and ``restore`` to the root command."""
    app.add_typer(backup_app, name="backup")
    app.command("restore")(restore)


@backup_app.callback(invoke_without_command=True)
def backup(
    ctx: typer.Context,
    to: Annotated[Path | None, typer.Option(help="The backup folder (created if new).")] = None,
    host: Host = DEFAULT_HOST,
    port: Port = DEFAULT_PORT,
    bucket: Bucket = DEFAULT_BUCKET,
    user: User = DEFAULT_USER,
    password: Password = DEFAULT_PASSWORD,
    tls: Tls = False,
    tls_ca: TlsCa = None,
    master: Master = None,
) -> None:
    """Back up what changed since the last run into **--to** as a new run.

    The first run reads everything; each later one only the changes since the previous run
    ended (rollbacks included: a restore undoes what the server lost). Subcommands `list`
    and `verify` inspect a backup folder.
    """
    if ctx.invoked_subcommand is not None:
        return
    if to is None:
        typer.echo("dcpkv backup: give --to DIR (or a subcommand: list, verify)", err=True)
        raise typer.Exit(2)
    from dcpkv.pipelines.backup import BACKUP_PHASES, describe_run, run_backup

    ep = connection_settings(host, port, bucket, user, password, tls, tls_ca)
    run = _job(
        "backup", BACKUP_PHASES, lambda spark, phase: run_backup(spark, to, ep, phase), master
    )
    typer.echo(f"{describe_run(run)} -> {run.path}")


@backup_app.command("list")
def list_runs(from_: From) -> None:
    """Show the runs of a backup folder: time, changes, vbuckets, rollbacks."""
    from rich.console import Console

    from dcpkv.pipelines.backup_layout import BackupError, committed_runs, incomplete_runs

    try:
        runs = committed_runs(from_)
    except BackupError as exc:
        typer.echo(f"dcpkv backup list: {exc}", err=True)
        raise typer.Exit(1) from None
    if not runs:
        typer.echo(f"dcpkv backup list: no committed run in {from_}", err=True)
        raise typer.Exit(1)
    Console(width=200).print(_runs_table(runs))
    for leftover in incomplete_runs(from_):
        typer.echo(f"ignored (incomplete, from a crashed run): {leftover.name}")


def _runs_table(runs: list[Any]) -> Any:
    from rich.table import Table

    table = Table("run", "finished (UTC)", "changes", "mut", "del", "exp", "vbuckets", "rollbacks")
    for run in runs:
        m = run.manifest
        t = m["totals"]
        vbs = m["vbuckets"]
        touched = sum(1 for v in vbs.values() if v["max_seqno"] or v["rollbacks"])
        rbs = ", ".join(f"vb {r['vbucket']} -> {r['seqno']}" for r in m["rollbacks"]) or "-"
        table.add_row(
            run.path.name, m["finished_at"], str(t["changes"]), str(t["mutations"]),
            str(t["deletions"]), str(t["expirations"]), f"{touched}/{len(vbs)}", rbs,
        )  # fmt: skip
    return table


@backup_app.command("verify")
def verify_cmd(from_: From) -> None:
    """Check a backup folder: no gap between runs, files match their checksums, rollbacks
    recorded where the history branched. Exits 1 on any problem."""
    from dcpkv.pipelines.backup_layout import committed_runs, verify

    problems = verify(from_)
    if problems:
        for problem in problems:
            typer.echo(f"dcpkv backup verify: {problem}", err=True)
        typer.echo(f"dcpkv backup verify: {from_}: {len(problems)} problem(s)", err=True)
        raise typer.Exit(1)
    runs = committed_runs(from_)
    typer.echo(f"{from_}: {len(runs)} run(s), chain contiguous, every file matches its checksum")


def restore(
    from_: From,
    to_seqnos: Annotated[
        str | None,
        typer.Option(
            help='Point in time: {"vbucket": seqno} JSON, a dcpkv offset JSON or a run '
            "manifest, or a FILE holding one [default: the end of the backup]."
        ),
    ] = None,
    host: Host = DEFAULT_HOST,
    port: Port = DEFAULT_PORT,
    bucket: Bucket = DEFAULT_BUCKET,
    user: User = DEFAULT_USER,
    password: Password = DEFAULT_PASSWORD,
    tls: Tls = False,
    tls_ca: TlsCa = None,
    master: Master = None,
    durability: DurabilityLevel = "none",
) -> None:
    """Replay a backup's runs (rollbacks honoured) and load the latest version of every key
    into a bucket; deleted keys are deleted. **--to-seqnos** restores a point in time: each
    vbucket as it was when the backup first reached that seqno."""
    from dcpkv.pipelines.backup import RESTORE_PHASES, BackupError, parse_to_seqnos
    from dcpkv.pipelines.backup import restore as restore_job

    try:
        cut = parse_to_seqnos(to_seqnos) if to_seqnos else None
    except BackupError as exc:
        typer.echo(f"dcpkv restore: {exc}", err=True)
        raise typer.Exit(2) from None
    ep = connection_settings(host, port, bucket, user, password, tls, tls_ca)
    level = durability_level(durability)
    result = _job(
        "restore", RESTORE_PHASES,
        lambda spark, phase: restore_job(spark, from_, ep, cut, phase, durability=level),
        master,
    )  # fmt: skip
    typer.echo(
        f"restored {result.runs} run(s) into {bucket!r} at {host}:{port}: {result.upserts} "
        f"document(s) written, {result.deletions} deleted, {result.rollbacks_applied} "
        "rollback(s) applied"
    )


def _job(name: str, phases: tuple[str, ...], job: Any, master: str | None) -> Any:
    """Run ``job(spark, on_phase)`` under a progress bar; errors end the command."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from dcpkv.pipelines.backup_layout import BackupError

    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"{name}: starting Spark", total=len(phases))

        def on_phase(phase: str) -> None:
            progress.update(task, description=f"{name}: {phase}", completed=phases.index(phase))

        try:
            from dcpkv.pipelines.spark_session import get_spark

            result = job(get_spark(f"dcpkv-{name}", master), on_phase)
        except (BackupError, OSError) as exc:
            typer.echo(f"dcpkv {name}: {exc}", err=True)
            raise typer.Exit(1) from None
        except Exception as exc:  # a failed Spark job (or connection): one line is enough
            typer.echo(f"dcpkv {name}: {error_line(exc)}", err=True)
            raise typer.Exit(1) from None
        progress.update(task, completed=len(phases))
    sys.stderr.flush()
    return result


_ERROR_LINE = re.compile(r"^\s*([\w.]+(Error|Exception)(: .*)?)$")


def error_line(exc: BaseException) -> str:
    """The line that says what went wrong: for a Spark job that failed in a Python worker,
    the Python exception at the end of the worker's traceback (the JVM's wrapper and stack
    say nothing), else the message's first line."""
    text = str(exc).strip()
    worker = text.partition("Traceback (most recent call last):")[2]
    for line in reversed(worker.split("SQLSTATE")[0].splitlines()):
        match = _ERROR_LINE.match(line)
        if match:
            return match.group(1)
    return text.splitlines()[0] if text else type(exc).__name__

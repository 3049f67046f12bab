"""``dcpkv demo`` (the main job) and ``dcpkv pipeline report``: thin typer shells.

Theory of operation
-------------------
The commands parse flags and hand over to :mod:`dcpkv.app.demo` and
:mod:`dcpkv.pipelines.report`; heavy imports (Spark, matplotlib) happen inside the commands so
``dcpkv --help`` stays fast. ``main.py`` registers them in two lines (``report`` joins the
``pipeline`` group).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dcpkv.cli.options import DurabilityLevel, durability_level


def demo(
    data_dir: Annotated[
        Path, typer.Option(help="The node's data; the pipelines write under DATA_DIR/pipelines.")
    ] = Path("./dcpkv-data"),
    port: Annotated[
        int, typer.Option(help="The node's port (0 picks a free one; one node only).")
    ] = 11210,
    docs: Annotated[int, typer.Option(min=1, help="Sample documents to load.")] = 30_000,
    duration: Annotated[
        float | None, typer.Option(help="Run this many seconds, then stop cleanly.")
    ] = None,
    master: Annotated[
        str | None,
        typer.Option(
            envvar="SPARK_MASTER",
            help="Spark master URL [default: $DCPKV_SPARK_MASTER or local[*]].",
        ),
    ] = None,
    rate: Annotated[float, typer.Option(min=0, help="Changes written per second.")] = 200.0,
    durability: DurabilityLevel = "none",
    vbuckets: Annotated[int, typer.Option(min=1, help="vbuckets of a new bucket.")] = 1024,
    nodes: Annotated[
        int, typer.Option(min=1, help="Data nodes: more than 1 runs a local cluster.")
    ] = 1,
    replicas: Annotated[
        int, typer.Option(min=0, max=3, help="Replicas per vbucket (a cluster only).")
    ] = 1,
    chaos: Annotated[
        bool,
        typer.Option(help="Kill a random node every so often; it is failed over and recovered."),
    ] = False,
    chaos_every: Annotated[
        str, typer.Option(help="Seconds between two kills: A-B (drawn uniformly) or A.")
    ] = "20-40",
    failover_timeout: Annotated[
        int,
        typer.Option(
            min=1,
            max=3600,
            help="Seconds a killed node stays silent before the manager fails it over (--chaos).",
        ),
    ] = 5,
) -> None:
    """Run the main job: a node, sample data, a live mirror and view on Spark, until Ctrl-C.

    Starts `dcpkv server` on 127.0.0.1:PORT with its data in DATA_DIR, loads the sample data
    set (once: a re-run resumes), then mirrors the bucket and keeps the `revenue_by_country`
    view up to date on Spark while a generator writes changes. Ctrl-C or SIGTERM stops
    everything cleanly, after a last catch-up and a check that the mirror and the view equal
    the bucket (exit status 1 if not); a metrics report PNG is written at exit.

    With `--nodes 3 --replicas 1` the same job runs on a local cluster (what `dcpkv cluster
    up` starts: managed nodes on free ports and the manager, under DATA_DIR/cluster); the
    writers and the pipelines reach it through its connection string and follow its map.
    `--chaos` then kills a random node (kill -9) every `--chaos-every` seconds, waits for the
    manager's automatic failover, restarts the node and takes it back with delta recovery
    and a rebalance; the live line counts the failovers, and the report marks them.
    """
    from rich.console import Console

    from dcpkv.app.chaos import ChaosSettings, parse_every
    from dcpkv.app.demo import DemoSettings, run_demo

    if chaos and (nodes < 2 or replicas < 1):
        typer.echo("dcpkv demo: --chaos needs a cluster with replicas (--nodes 3 --replicas 1)",
                   err=True)  # fmt: skip
        raise typer.Exit(2)
    try:
        every = parse_every(chaos_every)
    except ValueError as exc:
        typer.echo(f"dcpkv demo: --chaos-every: {exc}", err=True)
        raise typer.Exit(2) from None
    chaos_settings = ChaosSettings(every, failover_timeout) if chaos else None
    settings = DemoSettings(
        data_dir=data_dir, port=port, docs=docs, duration=duration, master=master, rate=rate,
        num_vbuckets=vbuckets, nodes=nodes, replicas=replicas, chaos=chaos_settings,
        durability=durability_level(durability),
    )  # fmt: skip
    raise typer.Exit(run_demo(settings, Console(highlight=False, soft_wrap=True)))


def report(
    dirs: Annotated[
        list[Path], typer.Argument(help="Mirror or view folders holding _metrics.jsonl.")
    ],
    out: Annotated[
        Path | None, typer.Option(help="The PNG to write [default: FIRST_DIR/report.png].")
    ] = None,
) -> None:
    """Draw the pipelines' throughput and lag over time (from _metrics.jsonl) as a PNG."""
    from dcpkv.pipelines.report import ReportError, draw_report

    try:
        written = draw_report(dirs, out or dirs[0] / "report.png")
    except ReportError as exc:
        typer.echo(f"dcpkv pipeline report: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(str(written))

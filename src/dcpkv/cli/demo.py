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


def demo(
    data_dir: Annotated[
        Path, typer.Option(help="The node's data; the pipelines write under DATA_DIR/pipelines.")
    ] = Path("./dcpkv-data"),
    port: Annotated[int, typer.Option(help="The node's port (0 picks a free one).")] = 11210,
    docs: Annotated[int, typer.Option(min=1, help="Sample documents to load.")] = 30_000,
    duration: Annotated[
        float | None, typer.Option(help="Run this many seconds, then stop cleanly.")
    ] = None,
    master: Annotated[
        str | None,
        typer.Option(envvar="SPARK_MASTER", help="Spark master URL [default: local[2]]."),
    ] = None,
    rate: Annotated[float, typer.Option(min=0, help="Changes written per second.")] = 200.0,
    vbuckets: Annotated[int, typer.Option(min=1, help="vbuckets of a new bucket.")] = 1024,
) -> None:
    """Run the main job: a node, sample data, a live mirror and view on Spark, until Ctrl-C.

    Starts `dcpkv server` on 127.0.0.1:PORT with its data in DATA_DIR, loads the sample data
    set (once: a re-run resumes), then mirrors the bucket and keeps the `revenue_by_country`
    view up to date on Spark while a generator writes changes. Ctrl-C or SIGTERM stops
    everything cleanly, after a last catch-up; a metrics report PNG is written at exit.
    """
    from rich.console import Console

    from dcpkv.app.demo import DemoSettings, run_demo

    settings = DemoSettings(
        data_dir=data_dir, port=port, docs=docs, duration=duration, master=master, rate=rate,
        vbuckets=vbuckets,
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

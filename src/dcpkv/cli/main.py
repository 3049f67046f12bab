"""`dcpkv`: one command, one subcommand per job."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="dcpkv",
    help="dcpkv: a partitioned key-value store with a correct, resumable change stream (DCP).",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def demo() -> None:
    """Run the main job on the embedded defaults.

    For now: the humpty-dumpty rollback example of the spec (a consumer that resumes with its
    true snapshot is told to roll back; one that lies about its snapshot is not).
    """
    from dcpkv.cli.humpty_dumpty import run_spec_example

    raise typer.Exit(run_spec_example())


@app.callback()
def _root() -> None:
    """dcpkv: a partitioned key-value store with a correct, resumable change stream (DCP)."""

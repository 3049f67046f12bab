"""Running a view: the streaming query that keeps it up to date, from the server or a mirror.

Theory of operation
-------------------
See the package docstring (:mod:`dcpkv.pipelines.views`) for how a view works as a whole.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.table_job import BatchStats, TableJob, start_stream
from dcpkv.pipelines.views.definition import (
    save_definition,
    view_definition,
    view_rows,
    view_schema,
)
from dcpkv.pipelines.views.follower import MirrorFollower

# -- running ------------------------------------------------------------------------------------


def start_view(
    spark: Any,
    views_dir: Path,
    name: str,
    source: SourceSettings | Path,
    *,
    available_now: bool = False,
    on_batch: Callable[[BatchStats], None] | None = None,
    trigger_seconds: float = 1.0,
    compact_every: int | None = 10,
) -> Any:
    """Keep view ``name`` up to date from the server or from a mirror; a StreamingQuery."""
    if not isinstance(source, SourceSettings):
        follower = view_follower(spark, views_dir, name, Path(source), on_batch)
        return follower.start(available_now=available_now, trigger_seconds=trigger_seconds)
    definition = view_definition(views_dir, name)
    table = Path(views_dir) / name
    definition["source"] = {"server": source.to_json_obj()}
    save_definition(views_dir, name, definition)
    job = TableJob(
        spark=spark,
        table=table,
        schema=view_schema(),
        transform=view_rows(definition["map"]),
        source=source,
        checkpoint=table / "_checkpoint",
        compact_every=compact_every,
        on_batch=on_batch,
    )
    return start_stream(
        spark, source, job, available_now=available_now, trigger_seconds=trigger_seconds
    )


def view_follower(
    spark: Any,
    views_dir: Path,
    name: str,
    mirror: Path,
    on_batch: Callable[[BatchStats], None] | None = None,
    *,
    background: bool = False,
) -> MirrorFollower:
    """View ``name`` fed by ``mirror``'s batches (its definition records the mirror): start
    its own tick stream (:meth:`MirrorFollower.start`), or pass :meth:`MirrorFollower.follow`
    as the mirror's ``after_commit`` so both run in one query, one batch (and, with
    ``background`` compaction, :meth:`MirrorFollower.stop` as its ``on_stop``)."""
    definition = view_definition(views_dir, name)
    definition["source"] = {"mirror": str(Path(mirror).resolve())}
    save_definition(views_dir, name, definition)
    table = Path(views_dir) / name
    return MirrorFollower(
        spark, table, Path(mirror), definition["map"], on_batch, background=background
    )

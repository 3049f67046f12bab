"""Incremental map/reduce views over a bucket's JSON documents (CouchDB/Couchbase style).

Theory of operation
-------------------
A view ``NAME`` lives in ``views_dir/NAME/``: ``view.json`` (the map function, the reduce, and
the source of the last run) and a versioned change table (``vtable.py``) whose rows are the
*emissions of one version of one document*: ``(vbucket, key, seqno, op, emits)`` where
``emits`` is the list of ``(emit key, emit value)`` the map function returned for that
version, both as JSON text. So the view is a mirror whose payload is the map's output:

* an update is a new version: the document's current version is its live row with the
  highest seqno, so its old emissions are retracted by being superseded;
* a deletion/expiration is a version with no emissions;
* rollback rows become the same manifest entries as in the mirror (with the same resync
  fallback), so the view falls back exactly to the emissions of the surviving versions.

The map runs once per change, in the Spark tasks (a Python UDF); reduce runs at query time
over the current emissions (count, sum, stats built in, or a custom ``module:function`` that
gets the list of values), grouped by emit key with ``group``.

Two sources. A :class:`~dcpkv.pipelines.mirror.SourceSettings` streams from the server (the
same ``TableJob`` as the mirror). A mirror path follows the mirror's batches instead: a tiny
streaming source (``dcpkvmirrorticks``) offers the mirror's batch ordinal as its offset, and
each batch copies the mirror's rows with ``ord`` in (done, M] through the map, keeping their
``ord``/``pos``, and the mirror's entries, floors and applied offsets: the view's liveness
rules then give exactly the map of the mirror's documents. A mirror compaction drops old
deletions only once they are older than its previous compaction; a view further behind than
that rebuilds from the mirror.

``query_view`` reads the view's Parquet files through its manifest with pyarrow on the driver
(no Spark job: a query is small next to starting one). ``stale="false"`` first reads the
server's vbucket uuids and high seqnos, then waits (bounded by ``timeout``) until the view's
applied offsets reach them on the same branch: the barrier of spec 002. Emit keys sort in
CouchDB collation (null, false, true, numbers, strings, arrays, objects).
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from dcpkv.pipelines import vtable
from dcpkv.pipelines.mirror import (
    BatchStats,
    SourceSettings,
    TableJob,
    caught_up,
    mirror_schema,
    server_seqnos,
    start_stream,
)

VIEW_FILE = "view.json"
BUILTIN_REDUCES = ("count", "sum", "stats")
POLL_SECONDS = 0.2


class ViewError(ValueError):
    """A view that does not exist, a bad definition, or a query it cannot answer."""


# -- definitions ----------------------------------------------------------------------------------


def load_function(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ViewError(f"{spec!r} is not module:function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ViewError(f"cannot load {spec!r}: {exc}") from None
    if not callable(fn):
        raise ViewError(f"{spec!r} is not callable")
    return fn


def create_view(views_dir: Path, name: str, map_fn: str, reduce: str | None = None) -> None:
    """Define view ``name``: ``map_fn`` and a custom ``reduce`` are ``module:function``."""
    load_function(map_fn)
    if reduce is not None and reduce not in BUILTIN_REDUCES:
        load_function(reduce)
    if not name or "/" in name or name.startswith((".", "_")):
        raise ViewError(f"bad view name {name!r}")
    folder = Path(views_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / VIEW_FILE).write_text(json.dumps({"map": map_fn, "reduce": reduce}, indent=1))


def view_definition(views_dir: Path, name: str) -> dict[str, Any]:
    path = Path(views_dir) / name / VIEW_FILE
    if not path.exists():
        raise ViewError(f"no view {name!r} in {views_dir}")
    return json.loads(path.read_text())


def _save_definition(views_dir: Path, name: str, definition: dict[str, Any]) -> None:
    path = Path(views_dir) / name / VIEW_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(definition, indent=1))
    tmp.replace(path)


# -- the map, in the tasks -----------------------------------------------------------------------

_MAPS: dict[str, Callable[..., Any]] = {}


def canonical(value: Any) -> str:
    """JSON text that is equal for equal values (emit keys are compared as text)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def emissions(spec: str, key: bytes, value: bytes | None, op: str) -> list[tuple[str, str]] | None:
    """The map of one change: None for a rollback row, [] for deletions and non-JSON."""
    if op == "rollback":
        return None
    if op != "mutation" or value is None:
        return []
    try:
        doc = json.loads(bytes(value))
    except ValueError:
        return []  # not JSON: a view indexes JSON documents only, as in Couchbase
    if not isinstance(doc, dict):
        return []
    fn = _MAPS.get(spec) or _MAPS.setdefault(spec, load_function(spec))
    try:
        out = fn(bytes(key).decode("utf-8", "replace"), doc) or ()
        return [(canonical(k), canonical(v)) for k, v in out]
    except Exception:
        return []


def view_schema() -> Any:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        DecimalType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    emit = StructType([StructField("key", StringType()), StructField("value", StringType())])
    return StructType(
        [
            StructField("op", StringType()),
            StructField("vbucket", IntegerType()),
            StructField("key", BinaryType()),
            StructField("seqno", LongType()),
            StructField("vb_uuid", DecimalType(20, 0)),
            StructField("emits", ArrayType(emit)),
            StructField("ord", LongType()),
            StructField("pos", LongType()),
        ]
    )


def view_rows(spec: str, keep_position: bool = False) -> Callable[[Any], Any]:
    """Source (or mirror) rows -> stored emission rows."""
    from pyspark.sql import functions as F

    emits_type = view_schema()["emits"].dataType
    udf = F.udf(lambda k, v, op: emissions(spec, k, v, op), emits_type, useArrow=False)

    def transform(df: Any) -> Any:
        cols = [
            "op",
            "vbucket",
            "key",
            F.col("seqno").cast("long").alias("seqno"),
            "vb_uuid",
            udf("key", "value", "op").alias("emits"),
        ]
        return df.select(*cols, *(["ord", "pos"] if keep_position else []))

    return transform


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
    definition = view_definition(views_dir, name)
    table = Path(views_dir) / name
    if isinstance(source, SourceSettings):
        definition["source"] = {"server": source.__dict__}
    else:
        definition["source"] = {"mirror": str(Path(source).resolve())}
    _save_definition(views_dir, name, definition)
    if isinstance(source, SourceSettings):
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
    follower = MirrorFollower(spark, table, Path(source), definition["map"], on_batch)
    return follower.start(available_now=available_now, trigger_seconds=trigger_seconds)


class MirrorTicks(DataSource):
    """A streaming source whose offset is a mirror's batch ordinal; its batches hold no rows,
    they only tell the follower when the mirror has moved."""

    @classmethod
    def name(cls) -> str:
        return "dcpkvmirrorticks"

    def schema(self) -> str:
        return "tick int"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _TickReader(Path(self.options["path"]))


class _TickReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, mirror: Path) -> None:
        self.mirror = mirror
        self._target: int | None = None

    def initialOffset(self) -> dict[str, Any]:
        return {"ord": -1}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = vtable.load_manifest(self.mirror).ord

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        ord_ = vtable.load_manifest(self.mirror).ord
        return {"ord": ord_ if self._target is None else min(ord_, self._target)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        return iter(())


@dataclass
class MirrorFollower:
    """Applies a mirror's new batches to a view (the ``foreachBatch`` of the tick stream)."""

    spark: Any
    table: Path
    mirror: Path
    map_spec: str
    on_batch: Callable[[BatchStats], None] | None = None
    compact_every: int = 10

    def start(self, *, available_now: bool, trigger_seconds: float) -> Any:
        self.spark.dataSource.register(MirrorTicks)
        ticks = self.spark.readStream.format("dcpkvmirrorticks").option("path", str(self.mirror))
        writer = ticks.load().writeStream.foreachBatch(self)
        writer = writer.option("checkpointLocation", str(self.table / "_checkpoint"))
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
        return writer.start()

    def __call__(self, _df: Any, batch_id: int) -> None:
        view = vtable.load_manifest(self.table)
        if batch_id <= view.batch_id:
            return
        started = time.monotonic()
        mirror = vtable.load_manifest(self.mirror)
        done = int(view.extra.get("mirror_ord", 0))
        if done < int(mirror.extra.get("dropped_through", 0)):
            view.retired.extend(view.files)  # too far behind: rebuild from the mirror
            view.files, view.entries, done = [], [], 0
        rows = 0
        if mirror.files and mirror.ord > done:
            rows = self._copy_rows(view, mirror, done)
        new_entries = [e for e in mirror.entries if done < e.ord <= mirror.ord]
        view.entries.extend(new_entries)
        view.floors = dict(mirror.floors)
        view.applied = dict(mirror.applied)
        view.extra["mirror_ord"] = mirror.ord
        view.ord = max(view.ord, mirror.ord)
        view.batch_id = batch_id
        vtable.commit_manifest(self.table, view)
        if view.ord - view.compacted_ord >= self.compact_every:
            vtable.compact(self.spark, self.table, view, view_schema(), {})
        self._report(batch_id, rows, len(new_entries), started, view)

    def _copy_rows(self, view: vtable.Manifest, mirror: vtable.Manifest, done: int) -> int:
        from pyspark.sql import functions as F

        paths = [str(self.mirror / f) for f in mirror.files]
        source = self.spark.read.schema(mirror_schema()).parquet(*paths)
        new = source.filter((F.col("ord") > done) & (F.col("ord") <= mirror.ord))
        name = vtable.write_rows(
            self.table, view_rows(self.map_spec, True)(new), f"m{mirror.ord:08d}"
        )
        view.files.append(name)
        return self.spark.read.parquet(str(self.table / name)).count()

    def _report(
        self, batch_id: int, rows: int, rollbacks: int, started: float, view: vtable.Manifest
    ) -> None:
        stats = BatchStats(batch_id, time.time(), rows, rollbacks, time.monotonic() - started, None)
        vtable.append_metrics(self.table, stats.__dict__)
        if self.on_batch is not None:
            self.on_batch(stats)


# -- querying -----------------------------------------------------------------------------------


def query_view(
    spark: Any | None,
    views_dir: Path,
    name: str,
    *,
    key: Any = None,
    range: tuple[Any, Any] | None = None,
    group: bool = False,
    stale: Literal["ok", "false"] = "ok",
    source: SourceSettings | None = None,
    timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """Rows ``{"id", "key", "value"}`` sorted by emit key (no reduce), or reduced rows
    ``{"key", "value"}`` (one with key None, or one per emit key with ``group``).

    ``range`` is inclusive at both ends; ``stale="false"`` waits for the view to catch up
    with the server as it is now (``source`` or the one the view last ran from).
    """
    definition = view_definition(views_dir, name)
    table = Path(views_dir) / name
    if stale == "false":
        wait_caught_up(table, source or _recorded_source(definition), timeout)
    elif stale != "ok":
        raise ViewError(f"stale must be ok or false, not {stale!r}")
    rows = current_emissions(table)
    if key is not None:
        wanted = canonical(key)
        rows = [r for r in rows if r[1] == wanted]
    decoded = [(doc, json.loads(k), json.loads(v)) for doc, k, v in rows]
    if range is not None:
        low, high = collation_key(range[0]), collation_key(range[1])
        decoded = [r for r in decoded if low <= collation_key(r[1]) <= high]
    decoded.sort(key=lambda r: (collation_key(r[1]), r[0]))
    reduce = definition.get("reduce")
    if reduce is None:
        return [{"id": doc, "key": k, "value": v} for doc, k, v in decoded]
    return reduce_rows(reduce, [(k, v) for _doc, k, v in decoded], group)


def _recorded_source(definition: dict[str, Any]) -> SourceSettings:
    src = definition.get("source", {})
    if "server" in src:
        return SourceSettings(**src["server"])
    raise ViewError("stale=false needs the server: pass source (the view follows a mirror)")


def wait_caught_up(table: Path, source: SourceSettings, timeout: float) -> None:
    """Block until the view has applied the server's high seqnos of now (same branch)."""
    highs = server_seqnos(source)
    deadline = time.monotonic() + timeout
    while not caught_up(vtable.load_manifest(table).applied_seqnos(), highs):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"view {table.name} did not catch up within {timeout}s")
        time.sleep(POLL_SECONDS)


def current_emissions(table: Path) -> list[tuple[str, str, str]]:
    """(document key, emit key JSON, emit value JSON) of every current document version."""
    import pyarrow.parquet as pq

    manifest = vtable.load_manifest(table)
    latest: dict[bytes, tuple[tuple[int, int, int], str, list[Any]]] = {}
    cols = ["op", "vbucket", "key", "seqno", "emits", "ord", "pos"]
    for name in manifest.files:
        for path in sorted((table / name).rglob("*.parquet")):
            for row in pq.read_table(path, columns=cols).to_pylist():
                if row["op"] == "rollback" or _is_dead(row, manifest.entries):
                    continue
                order = (row["seqno"], row["ord"], row["pos"])
                have = latest.get(row["key"])
                if have is None or have[0] < order:
                    latest[row["key"]] = (order, row["op"], row["emits"] or [])
    out = []
    for doc_key, (_order, op, emits) in latest.items():
        if op == "mutation":
            doc = doc_key.decode("utf-8", "replace")
            out.extend((doc, e["key"], e["value"]) for e in emits)
    return out


def _is_dead(row: dict[str, Any], entries: Iterable[vtable.Entry]) -> bool:
    place = (row["ord"], row["pos"])
    for e in entries:
        if e.vbucket != row["vbucket"]:
            continue
        if e.kind == "rollback" and place < (e.ord, e.pos) and row["seqno"] > e.seqno:
            return True
        if e.kind == "skip" and place > (e.ord, e.pos) and row["seqno"] <= e.seqno:
            return True
    return False


def collation_key(value: Any) -> tuple[Any, ...]:
    """CouchDB's order of JSON values: null < false < true < numbers < strings < arrays <
    objects; arrays element by element, objects by their (key, value) pairs."""
    if value is None:
        return (0,)
    if value is False:
        return (1,)
    if value is True:
        return (2,)
    if isinstance(value, int | float):
        return (3, value)
    if isinstance(value, str):
        return (4, value)
    if isinstance(value, list):
        return (5, tuple(collation_key(v) for v in value))
    return (6, tuple((k, collation_key(v)) for k, v in sorted(value.items())))


def reduce_rows(reduce: str, pairs: list[tuple[Any, Any]], group: bool) -> list[dict[str, Any]]:
    fn = _reducer(reduce)
    if not group:
        return [{"key": None, "value": fn([v for _k, v in pairs])}] if pairs else []
    out: list[dict[str, Any]] = []
    for k, v in pairs:  # sorted by key: equal keys are adjacent
        if out and canonical(out[-1]["key"]) == canonical(k):
            out[-1]["values"].append(v)
        else:
            out.append({"key": k, "values": [v]})
    return [{"key": row["key"], "value": fn(row["values"])} for row in out]


def _reducer(reduce: str) -> Callable[[list[Any]], Any]:
    if reduce == "count":
        return len
    if reduce == "sum":
        return _sum
    if reduce == "stats":
        return stats
    return load_function(reduce)


def _sum(values: list[Any]) -> Any:
    return sum(_numbers(values))


def _numbers(values: list[Any]) -> list[float | int]:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(nums) != len(values):
        raise ViewError("sum and stats reduce numbers only")
    return nums


def stats(values: list[Any]) -> dict[str, Any]:
    """Couchbase's _stats: sum, count, min, max, sumsqr."""
    nums = _numbers(values)
    return {
        "sum": sum(nums),
        "count": len(nums),
        "min": min(nums) if nums else None,
        "max": max(nums) if nums else None,
        "sumsqr": sum(n * n for n in nums),
    }

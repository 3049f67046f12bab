"""A versioned change table in plain Parquet, committed atomically through a JSON manifest.

Theory of operation
-------------------
The mirror and the views both keep *changes* per vbucket, not just the latest document, because
a rollback row (``op = "rollback"``, seqno R) asks to drop the changes of a vbucket above R
and fall back to the versions that were current at R. Delta Lake would give atomic commits,
but its jars come from Maven, which this machine cannot reach; so this module does the small
part of it we need with plain Parquet and one JSON file.

Layout of a table directory ``T``::

    T/_manifest.json      the only mutable file, replaced atomically (write tmp, fsync, rename)
    T/data/<name>/        Parquet directories, immutable once written, named by the manifest
    T/_metrics.jsonl      one JSON line per batch (see ``BatchStats`` in ``mirror.py``)

Every stored change row carries ``vbucket``, ``key``, ``seqno``, ``op`` and its place in the
stream: ``ord`` (the table's batch ordinal) and ``pos`` (its position inside the batch,
``monotonically_increasing_id``, which keeps a partition's order, and a vbucket is always read
by one partition). A batch writes a new directory, then commits a manifest that names it.
A reader reads the manifest once and only the directories it names, so it sees every batch
whole or not at all.

Rollbacks are never applied by rewriting files. The manifest keeps *entries*:

* ``rollback`` (vb, R, ord, pos): a change of vb *before* (ord, pos) with seqno > R is dead
  (a reset to nothing is a rollback to -1);
* ``skip`` (vb, H, ord, pos): a change of vb *after* (ord, pos) with seqno <= H is dead (used
  after a resync that already holds the vbucket's state at H), up to the vbucket's next
  rollback entry: the skip hides the stream's re-sending of what the resync holds, and a
  later rollback starts another history (a second resync's rows, the changes of a new
  branch) whose seqnos at or below H are live. Without that end, a vbucket reset twice lost
  the documents of its second resync up to the first one's H: its oldest documents (the
  chaos demo with two failovers).

A change is live when no entry kills it (:func:`is_dead`, the rule for one row; the Spark
join in :func:`live_changes` is the same rule for a whole table); among the live changes the
seqnos of a vbucket are unique (the new branch restarts above R), so the current version of
a key is its live change with the highest seqno, and a deletion or expiration there means
"absent". Entries are kept forever (they are few): compaction keeps the rows' ``ord``/``pos``,
so the entries stay true of the rewritten rows, and a view built on this table can replay
them.

Retention (``compact``): per vbucket a *floor* F promises exact rollbacks to any R >= F. A
version is kept when it is the latest, or when the change that superseded it has a seqno > F
(a rollback to R >= F may bring it back); a latest deletion is dropped when its seqno <= F
(everything it hid is gone too, so it hides nothing) and it is older than the previous
compaction (``extra["dropped_through"]``: a follower of the ords that is behind that must
rebuild). The caller picks F from the server's
persisted seqno (see ``mirror.py``). A rollback to R < F finds history missing: the caller
resyncs that vbucket instead (a ``rollback`` to -1, a fresh read of the vbucket up to its high
seqno H with the same (ord, pos), and a ``skip`` to H), and F becomes H.

A compaction is two steps (``compact`` runs both at once): :func:`rewrite` writes what the
rule keeps of a manifest *snapshot* into a new directory, reading only the immutable files the
snapshot names, and commits nothing, so batches may commit meanwhile (``compactor.py`` runs it
in a thread); :func:`swap`, at a batch boundary, merges it into the manifest of that moment:
the snapshot's files give way to the rewritten directory, everything committed since stays
(files, entries, applied offsets). That is exact because the rewritten rows keep their (ord,
pos): a later rollback entry kills in them exactly what it killed in the files they replace,
and a later skip (after every rewritten row) none of them. Two cases need care. A later batch
decided "exact rollback or resync" with the floors of *its* manifest, lower than the floors the
rewrite used: a rollback it applied as exact below the rewrite's floor may need versions the
rewrite dropped, so such a rewrite is thrown away (:func:`stale_rewrite`; rare: the floors are
what every copy persisted, and rollbacks land at or above them). And a vbucket resynced since
the snapshot keeps the resync's floor: its reset entry kills every rewritten row of it.

Up to :data:`DRIVER_REWRITE_ROWS` stored rows the rewrite runs with pyarrow on the driver, a
larger table in Spark; the two apply the same rule.

Files replaced by a compaction are deleted at the next compaction, so a reader that read the
previous manifest has a whole compaction interval to finish. A swap also deletes directories
no manifest names (a batch or a rewrite that died before its commit or swap).
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dcpkv.core.files import atomic_write
from dcpkv.pipelines import decimal_files

MANIFEST = "_manifest.json"
METRICS = "_metrics.jsonl"
FORMAT = 1
DELETED_OPS = ("deletion", "expiration")


@dataclass(frozen=True)
class Entry:
    """A rollback (kills earlier changes above ``seqno``) or a skip (kills later ones at or
    below it), for one vbucket, at a place (ord, pos) of the stream."""

    kind: str
    vbucket: int
    seqno: int
    ord: int
    pos: int


@dataclass
class Manifest:
    """The committed state of a table; ``applied`` is the source offset JSON per vbucket."""

    generation: int = 0
    ord: int = 0
    batch_id: int = -1
    files: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    floors: dict[int, int] = field(default_factory=dict)
    applied: dict[int, dict[str, Any]] = field(default_factory=dict)
    retired: list[str] = field(default_factory=list)
    compacted_ord: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        # Shallow, and one line: ``asdict`` deep-copies every vbucket's offset and an indent
        # makes json.dumps use its pure-Python encoder; together 15 ms for a 1024-vbucket
        # manifest (1.5 ms now), paid at every batch's commit, the mirror's and the view's.
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["entries"] = [vars(e) for e in self.entries]
        doc["format"] = FORMAT
        doc["floors"] = {str(k): v for k, v in self.floors.items()}
        doc["applied"] = {str(k): v for k, v in self.applied.items()}
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        doc = json.loads(text)
        if doc.pop("format", None) != FORMAT:
            raise ValueError(f"not a format {FORMAT} table manifest")
        doc["entries"] = [Entry(**e) for e in doc["entries"]]
        doc["floors"] = {int(k): v for k, v in doc["floors"].items()}
        doc["applied"] = {int(k): v for k, v in doc["applied"].items()}
        return cls(**doc)

    def applied_seqnos(self) -> dict[int, tuple[int, int]]:
        """vbucket -> (vb_uuid, seqno) applied."""
        return {vb: (int(a["vb_uuid"]), int(a["seqno"])) for vb, a in self.applied.items()}


@dataclass(frozen=True)
class Scope:
    """An entry with the end of its reach: a skip stops at (``end_ord``, ``end_pos``), the place
    of the vbucket's next rollback entry; a rollback, or a skip with no rollback after it,
    reaches on (``end_ord`` None)."""

    entry: Entry
    end_ord: int | None = None
    end_pos: int | None = None

    def kills(self, vbucket: int, seqno: int, place: tuple[int, int]) -> bool:
        e = self.entry
        if e.vbucket != vbucket:
            return False
        if e.kind == "rollback":
            return place < (e.ord, e.pos) and seqno > e.seqno
        ended = self.end_ord is not None and place >= (self.end_ord, self.end_pos or 0)
        return place > (e.ord, e.pos) and not ended and seqno <= e.seqno


def scopes(entries: Iterable[Entry]) -> list[Scope]:
    """Every entry with its reach (see the module docstring): a skip ends at the first
    rollback entry of its vbucket strictly after it (the rollback that came with the same
    resync sits at the skip's own place, and ends nothing)."""
    rollbacks: dict[int, list[tuple[int, int]]] = {}
    for e in entries:
        if e.kind == "rollback":
            rollbacks.setdefault(e.vbucket, []).append((e.ord, e.pos))
    out = []
    for e in entries:
        later = [p for p in rollbacks.get(e.vbucket, ()) if p > (e.ord, e.pos)]
        if e.kind == "skip" and later:
            end_ord, end_pos = min(later)
            out.append(Scope(e, end_ord, end_pos))
        else:
            out.append(Scope(e))
    return out


def is_dead(vbucket: int, seqno: int, ord_: int, pos: int, reach: Iterable[Scope]) -> bool:
    """Whether an entry kills the change of ``vbucket`` at ``seqno``, stored at (ord, pos)."""
    return any(s.kills(vbucket, seqno, (ord_, pos)) for s in reach)


def load_manifest(table: Path) -> Manifest:
    path = table / MANIFEST
    if not path.exists():
        return Manifest()
    return Manifest.from_json(path.read_text())


def commit_manifest(table: Path, manifest: Manifest) -> None:
    """Replace the manifest atomically: a reader sees the old one or the new one, whole."""
    manifest.generation += 1
    tmp = table / f".{MANIFEST}.{uuid.uuid4().hex}.tmp"
    atomic_write(table / MANIFEST, manifest.to_json().encode(), tmp)


def new_data_dir(table: Path, tag: str) -> str:
    """A fresh relative directory name: attempts never collide, even a re-run batch."""
    return f"data/{tag}-{uuid.uuid4().hex[:12]}"


def append_metrics(table: Path, record: dict[str, Any]) -> None:
    with open(table / METRICS, "a") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")


# -- reading -------------------------------------------------------------------------------------


def live_changes(spark: Any, table: Path, manifest: Manifest, schema: Any) -> Any:
    """Every live change row (rollback rows and killed changes left out)."""
    from pyspark.sql import functions as F

    if not manifest.files:
        return spark.createDataFrame([], schema)
    directories = [table / f for f in manifest.files]
    rows = decimal_files.read(spark, directories, schema).filter(F.col("op") != "rollback")
    if not manifest.entries:
        return rows
    return _drop_dead(spark, rows, manifest.entries)


_ENTRY_SCHEMA = (
    "e_kind string, e_vbucket int, e_seqno long, e_ord long, e_pos long, "
    "e_end_ord long, e_end_pos long"
)


def _drop_dead(spark: Any, rows: Any, entries: Iterable[Entry]) -> Any:
    """``rows`` less those a rollback or skip entry kills.

    The entries are a small broadcast table and the kill rule one join condition: a crash on a
    1024-vbucket bucket leaves a thousand entries, and one OR-ed expression per entry nests deep
    enough to overflow the JVM stack in Spark's planner.
    """
    from pyspark.sql import functions as F

    table = spark.createDataFrame(
        [
            (s.entry.kind, s.entry.vbucket, s.entry.seqno, s.entry.ord, s.entry.pos,
             s.end_ord, s.end_pos)
            for s in scopes(entries)
        ],
        _ENTRY_SCHEMA,
    )  # fmt: skip
    ord_, pos, seqno = F.col("ord"), F.col("pos"), F.col("seqno")
    e_ord, e_pos, e_seqno = F.col("e_ord"), F.col("e_pos"), F.col("e_seqno")
    end_ord, end_pos = F.col("e_end_ord"), F.col("e_end_pos")
    before = (ord_ < e_ord) | ((ord_ == e_ord) & (pos < e_pos))
    after = (ord_ > e_ord) | ((ord_ == e_ord) & (pos > e_pos))
    before_end = end_ord.isNull() | (ord_ < end_ord) | ((ord_ == end_ord) & (pos < end_pos))
    kills = (F.col("e_kind") == "rollback") & before & (seqno > e_seqno)
    kills = kills | ((F.col("e_kind") != "rollback") & after & before_end & (seqno <= e_seqno))
    on = (F.col("vbucket") == F.col("e_vbucket")) & kills
    return rows.join(F.broadcast(table), on, "left_anti")


def current_versions(live: Any, columns: list[str]) -> Any:
    """The live change with the highest seqno per key, deletions included (as ``op``)."""
    from pyspark.sql import functions as F

    # (seqno, ord, pos) ascends along a key's live history; the struct's first fields order it.
    rest = [c for c in columns if c not in ("key", "seqno", "ord", "pos")]
    latest = live.groupBy("key").agg(F.max(F.struct("seqno", "ord", "pos", *rest)).alias("r"))
    return latest.select("key", "r.*")


def current_arrow(table: Path, manifest: Manifest, columns: Iterable[str] = ()) -> Any:
    """:func:`current_versions` of :func:`live_changes` with pyarrow on the driver, no Spark
    job (a live demo's reader asks every few seconds, and a Spark job would compete with the
    batches for the cores): a pyarrow Table of each key's current version (``op``, ``key``,
    ``vbucket``, ``seqno``, ``ord``, ``pos`` and ``columns``), deletions included (as ``op``).
    Dead rows are found with :func:`is_dead`, only for the vbuckets that have entries."""
    import pyarrow as pa
    import pyarrow.compute as pc

    place = ["op", "vbucket", "key", "seqno", "ord", "pos"]
    rows = _live_sorted_arrow(table, manifest, place + [c for c in columns if c not in place])
    if rows is None or rows.num_rows == 0:
        return rows
    n = rows.num_rows
    keys = rows["key"].combine_chunks()
    # the last row of each run of equal keys: the highest (seqno, ord, pos)
    last = pc.not_equal(keys.slice(0, n - 1), keys.slice(1))
    return rows.filter(pa.concat_arrays([last, pa.array([True])]))


def _live_sorted_arrow(table: Path, manifest: Manifest, columns: list[str] | None) -> Any:
    """The live change rows of ``manifest`` (``columns``, or all), rollback rows and dead rows
    dropped, sorted by (key, seqno, ord, pos), as one pyarrow Table; None without any file.
    Files of the old DECIMAL(20,0) schema are read as today's BIGINT."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parts = [
        decimal_files.as_bigint(pq.read_table(path, columns=columns))
        for name in manifest.files
        for path in sorted((table / name).rglob("*.parquet"))
    ]
    if not parts:
        return None
    rows = pa.concat_tables(parts, promote_options="permissive")
    rows = rows.filter(pc.not_equal(rows["op"], "rollback"))
    if manifest.entries:
        rows = rows.filter(pa.array(_live_mask(rows, scopes(manifest.entries)), pa.bool_()))
    return rows.sort_by([(c, "ascending") for c in ("key", "seqno", "ord", "pos")])


def _live_mask(rows: Any, reach: list[Scope]) -> list[bool]:
    by_vb: dict[int, list[Scope]] = {}
    for s in reach:
        by_vb.setdefault(s.entry.vbucket, []).append(s)
    cols = [rows[c].to_pylist() for c in ("vbucket", "seqno", "ord", "pos")]
    return [
        not is_dead(vb, seqno, o, p, by_vb[vb]) if vb in by_vb else True
        for vb, seqno, o, p in zip(*cols, strict=True)
    ]


def parquet_rows(directory: Path) -> int:
    """Rows of a written directory, from the Parquet footers."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in directory.rglob("*.parquet"))


# -- writing a batch -----------------------------------------------------------------------------


def stamp(df: Any, ord_: int, pos: int | Mapping[int, int] | None = None) -> Any:
    """Add ``ord`` and ``pos``: stream order inside the batch, one fixed ``pos``, or a fixed
    ``pos`` per vbucket (a resync of several vbuckets, each at its own rollback's place)."""
    from pyspark.sql import functions as F

    if pos is None:
        p = F.monotonically_increasing_id()
    elif isinstance(pos, Mapping):
        # one flat map lookup, not a CASE per vbucket (see _floor_column)
        # pos values of a task beyond the first exceed an int: every value a long
        pairs = [c for vb, at in sorted(pos.items()) for c in (F.lit(vb), F.lit(at).cast("long"))]
        p = F.try_element_at(F.create_map(*pairs), F.col("vbucket"))
    else:
        p = F.lit(pos).cast("long")
    return df.withColumn("ord", F.lit(ord_).cast("long")).withColumn("pos", p)


def write_rows(table: Path, df: Any, tag: str) -> str:
    name = new_data_dir(table, tag)
    df.write.mode("errorifexists").parquet(str(table / name))
    return name


def write_arrow(table: Path, rows: Any, tag: str) -> str:
    """:func:`write_rows` of pyarrow data, from the driver (:func:`write_arrow_dir`)."""
    name = new_data_dir(table, tag)
    write_arrow_dir(table / name, rows)
    return name


def write_arrow_dir(directory: Path, rows: Any) -> None:
    """Write ``rows`` into the new ``directory`` as one Parquet file and Spark's ``_SUCCESS``
    marker, so it reads like a directory Spark wrote. ``rows``: a pyarrow Table, record
    batches of one schema (written as they come, a row group each: the driver never holds
    them all), or None (no file: like an empty batch's directory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    path = directory / "part-00000.parquet"
    if isinstance(rows, pa.Table):
        pq.write_table(rows, path)
    elif rows is not None:
        writer = None
        try:
            for batch in rows:
                writer = writer or pq.ParquetWriter(path, batch.schema)
                writer.write_batch(batch)
        finally:
            if writer is not None:
                writer.close()
    (directory / "_SUCCESS").touch()


@dataclass(frozen=True)
class RollbackRow:
    vbucket: int
    seqno: int
    pos: int


@dataclass(frozen=True)
class BatchSummary:
    """What a written batch holds, read back in one job: its row count, its rollback rows (in
    stream order) and the smallest CAS of its changes (None when the rows carry no CAS, a
    view's, or there is no change). A CAS is a hybrid logical clock, nanoseconds since the
    epoch: the smallest is when the batch's oldest change was written."""

    rows: int
    rollbacks: list[RollbackRow]
    oldest_cas: int | None


def batch_summary(spark: Any, table: Path, name: str) -> BatchSummary:
    """:class:`BatchSummary` of a written batch: from the Parquet footers when they show no
    rollback row (the usual case: no Spark job at all), else from one Spark job."""
    quick = footer_summary(table / name)
    return quick if quick is not None else _summary_job(spark, table, name)


def footer_summary(directory: Path) -> BatchSummary | None:
    """The summary from the Parquet footers alone (row counts, and the min/max statistics of
    ``op`` and ``cas``), or None when they cannot tell: a row group without statistics, one
    whose largest ``op`` is ``rollback`` or above (rollback rows must be read), or one with
    a negative ``cas`` (a u64 from 2**63 up, no clock time: the job leaves those out)."""
    import pyarrow.parquet as pq

    rows, oldest, has_cas = 0, None, True
    for path in sorted(directory.glob("*.parquet")):
        meta = pq.ParquetFile(path).metadata
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            rows += group.num_rows
            stats = {
                group.column(j).path_in_schema: group.column(j).statistics
                for j in range(group.num_columns)
            }
            if "op" not in stats:
                return None
            has_cas = has_cas and "cas" in stats
            op = stats["op"]
            if group.num_rows and (op is None or not op.has_min_max or op.max >= "rollback"):
                return None
            cas = stats.get("cas")
            if has_cas and cas is not None and cas.has_min_max and int(cas.min) < 0:
                return None  # a CAS from 2**63 up (BIGINT bits): the job skips those
            if has_cas and cas is not None and cas.has_min_max:
                oldest = int(cas.min) if oldest is None else min(oldest, int(cas.min))
            elif has_cas and group.num_rows and (cas is None or cas.null_count != group.num_rows):
                return None  # changes whose CAS the footer does not show
    return BatchSummary(rows, [], oldest if has_cas else None)


def _summary_job(spark: Any, table: Path, name: str) -> BatchSummary:
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(table / name))
    is_rollback = F.col("op") == "rollback"
    aggs = [
        F.count(F.lit(1)).alias("rows"),
        F.collect_list(F.when(is_rollback, F.struct("vbucket", "seqno", "pos"))).alias("rb"),
    ]
    if "cas" in df.columns:
        clock = ~is_rollback & (F.col("cas") >= 0)  # from 2**63 up (negative): no clock time
        aggs.append(F.min(F.when(clock, F.col("cas"))).alias("oldest"))
    row = df.agg(*aggs).first()
    rollbacks = sorted(
        (RollbackRow(r.vbucket, int(r.seqno), r.pos) for r in row["rb"]), key=lambda r: r.pos
    )
    oldest = row["oldest"] if "cas" in df.columns else None
    return BatchSummary(int(row["rows"]), rollbacks, None if oldest is None else int(oldest))


def rollback_rows(spark: Any, table: Path, name: str) -> list[RollbackRow]:
    """The rollback rows a written batch holds, in stream order."""
    from pyspark.sql import functions as F

    rows = (
        spark.read.parquet(str(table / name))
        .filter(F.col("op") == "rollback")
        .select("vbucket", "seqno", "pos")
        .collect()
    )
    return sorted((RollbackRow(r.vbucket, int(r.seqno), r.pos) for r in rows), key=lambda r: r.pos)


def written_rollbacks(spark: Any, table: Path, name: str) -> list[RollbackRow]:
    """:func:`rollback_rows`, without a Spark job when the footers show none (the usual case)."""
    quick = footer_summary(table / name)
    return quick.rollbacks if quick is not None else rollback_rows(spark, table, name)


def without_vbuckets(spark: Any, table: Path, name: str, vbuckets: set[int]) -> str | None:
    """``name``, or (when some of its vbuckets must go) a new directory with the rows of the
    other vbuckets only, ``name`` deleted; None when nothing is left."""
    from pyspark.sql import functions as F

    if not vbuckets:
        return name
    rows = spark.read.parquet(str(table / name)).filter(~F.col("vbucket").isin(*sorted(vbuckets)))
    kept = None if rows.isEmpty() else write_rows(table, rows, Path(name).name.split("-")[0])
    delete_dirs(table, [name])
    return kept


# -- compaction ----------------------------------------------------------------------------------

COMPACT_GROWTH = 2  # due once the rows since the last compaction reach 1/2 of what it kept
COMPACT_LATEST = 10  # ... or, whatever the rows, after this many times ``every`` batches


def note_rows(manifest: Manifest, rows: int) -> None:
    """Count a batch's rows towards the next compaction (:func:`compaction_due`)."""
    manifest.extra["rows_since"] = int(manifest.extra.get("rows_since", 0)) + rows


def compaction_due(manifest: Manifest, every: int | None) -> bool:
    """Every ``every`` batches at the earliest, and then only once the rows written since the
    last compaction reach 1/:data:`COMPACT_GROWTH` of the rows it kept: a compaction rewrites
    the whole table, so a live stream of small batches would otherwise spend most of its time
    rewriting (seconds per batch's worth of changes); the cost now follows the growth. At the
    latest after :data:`COMPACT_LATEST` times ``every`` batches, which bounds the directories
    a reader opens."""
    if not every:
        return False
    batches = manifest.ord - manifest.compacted_ord
    if batches < every:
        return False
    grown = int(manifest.extra.get("rows_since", 0))
    kept = int(manifest.extra.get("compacted_rows", 0))
    return grown * COMPACT_GROWTH >= kept or batches >= COMPACT_LATEST * every


@dataclass(frozen=True)
class Rewrite:
    """A compaction's output, written but not yet in the manifest: the directory ``name``
    holds what the retention rule keeps of the snapshot ``base`` (its files, entries and
    ords up to ``base.ord``) under ``floors``; :func:`swap` merges it into the manifest of
    the moment."""

    name: str
    base: Manifest
    floors: dict[int, int]
    rows: int


def compact(
    spark: Any,
    table: Path,
    manifest: Manifest,
    schema: Any,
    new_floors: dict[int, int],
    *,
    files_hint: int = 4,
) -> Manifest:
    """Rewrite the live rows the retention rule keeps into one directory; commit. The table's
    writer is idle (or this is its batch): :func:`rewrite` then :func:`swap` at once."""
    done = rewrite(spark, table, manifest, schema, new_floors, files_hint=files_hint)
    swapped = swap(table, done, manifest)
    assert swapped is not None, "nothing was committed between the rewrite and its swap"
    return swapped


DRIVER_REWRITE_ROWS = 250_000  # up to this many stored rows a rewrite runs on the driver


def rewrite(
    spark: Any,
    table: Path,
    manifest: Manifest,
    schema: Any,
    new_floors: dict[int, int],
    *,
    files_hint: int = 4,
    name: str | None = None,
    on_driver: bool | None = None,
) -> Rewrite:
    """Write what the retention rule keeps of ``manifest`` (a snapshot: it reads only the
    immutable files the snapshot names) into a new directory (``name``, or a fresh one);
    commit nothing, so batches may keep committing meanwhile.

    Up to :data:`DRIVER_REWRITE_ROWS` stored rows (``on_driver`` None) the rule runs with
    pyarrow on the driver (:func:`_kept_arrow`): a live mirror of a few hundred thousand rows
    is a sort and a few vector comparisons, a tenth of a second, where the Spark job's shuffle
    and window took seconds of both cores from the batches running beside it. Larger tables
    go to Spark (:func:`_kept_spark`); both apply the same rule (a test holds them equal).

    ``new_floors`` only raises floors (a floor never goes down: history below it is gone).
    """
    base = Manifest.from_json(manifest.to_json())  # a copy the caller cannot change under us
    floors = dict(base.floors)
    for vb, f in new_floors.items():
        floors[vb] = max(floors.get(vb, 0), f)
    name = name or new_data_dir(table, f"c{base.ord:08d}")
    if on_driver is None:
        on_driver = sum(parquet_rows(table / f) for f in base.files) <= DRIVER_REWRITE_ROWS
    if on_driver:
        write_arrow_dir(table / name, _kept_arrow(table, base, floors))
    else:
        out = _kept_spark(spark, table, base, schema, floors).coalesce(files_hint)
        out.write.mode("errorifexists").parquet(str(table / name))
    return Rewrite(name, base, floors, parquet_rows(table / name))


def _kept_spark(
    spark: Any, table: Path, base: Manifest, schema: Any, floors: dict[int, int]
) -> Any:
    """The rows the retention rule keeps, as a Spark DataFrame (module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    live = live_changes(spark, table, base, schema)
    by_key = Window.partitionBy("key").orderBy("seqno", "ord", "pos")
    floor = _floor_column(floors)
    latest = F.col("_next").isNull()
    # A deletion that hides nothing is dropped only once it is older than the previous
    # compaction: a reader that follows the table's ords (a view on a mirror) and is less than
    # one compaction behind has seen it, so it cannot miss the deletion.
    droppable = (
        F.col("op").isin(*DELETED_OPS)
        & (F.col("seqno") <= floor)
        & (F.col("ord") <= base.compacted_ord)
    )
    kept = live.withColumn("_next", F.lead("seqno").over(by_key)).filter(
        (latest & ~droppable) | (~latest & (F.col("_next") > floor))
    )
    return kept.drop("_next")


def _kept_arrow(table: Path, base: Manifest, floors: dict[int, int]) -> Any:
    """:func:`_kept_spark` with pyarrow: the live rows sorted by (key, seqno, ord, pos), each
    compared with the next row of the same key."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = _live_sorted_arrow(table, base, None)
    if rows is None or rows.num_rows == 0:
        return rows
    n = rows.num_rows
    keys = rows["key"].combine_chunks()
    seqno = rows["seqno"].to_numpy().astype(np.int64)
    same_next = np.append(pc.equal(keys.slice(0, n - 1), keys.slice(1)).to_numpy(False), False)
    next_seqno = np.append(seqno[1:], 0)
    by_vb = np.zeros(max([*floors, 0]) + 1, dtype=np.int64)
    for vb, f in floors.items():
        by_vb[vb] = f
    vbuckets = rows["vbucket"].to_numpy()
    floor = np.where(vbuckets < len(by_vb), by_vb[np.minimum(vbuckets, len(by_vb) - 1)], 0)
    deleted = pc.is_in(rows["op"], pa.array(DELETED_OPS)).to_numpy(False)
    old = rows["ord"].to_numpy() <= base.compacted_ord
    droppable = deleted & (seqno <= floor) & old
    keep = (~same_next & ~droppable) | (same_next & (next_seqno > floor))
    return rows.filter(pa.array(keep))


def stale_rewrite(current: Manifest, done: Rewrite) -> bool:
    """Whether ``done`` cannot be swapped into ``current`` exactly: another compaction
    replaced its snapshot's files, or a batch committed since the snapshot applied a rollback
    as exact (it was at or above the floor *then*) below the floor the rewrite used, so the
    versions it brings back may be among those the rewrite dropped. Rare (a floor is what
    every copy persisted, and a rollback lands at or above it); the rewrite is then thrown
    away and the next compaction starts from the table as it is."""
    if not set(done.base.files) <= set(current.files):
        return True
    return any(
        e.kind == "rollback"
        and e.ord > done.base.ord
        and 0 <= e.seqno < done.floors.get(e.vbucket, 0)
        for e in current.entries
    )


def swap(table: Path, done: Rewrite, current: Manifest | None = None) -> Manifest | None:
    """Put a finished :func:`rewrite` into the table, at a batch boundary (the table's writer
    idle): the manifest of the moment, with the snapshot's files replaced by the rewrite's
    directory and everything committed since the snapshot kept as it is (later files,
    entries, applied offsets). The entries all stay: the rewritten rows keep their (ord, pos),
    so a rollback entry of a later batch still kills exactly the rows it should. A vbucket
    resynced since the snapshot keeps its resync's floor (its reset entry kills every
    rewritten row of it); every other floor becomes the rewrite's. None (and the rewrite's
    directory deleted) when the rewrite is :func:`stale_rewrite`. ``current``: the manifest
    of the moment when the caller holds it (else it is read)."""
    current = current if current is not None else load_manifest(table)
    if stale_rewrite(current, done):
        delete_dirs(table, [done.name])
        return None
    base = done.base
    reset = {
        e.vbucket
        for e in current.entries
        if e.ord > base.ord and e.kind == "rollback" and e.seqno < 0
    }
    for vb, f in done.floors.items():
        if vb not in reset:
            current.floors[vb] = max(current.floors.get(vb, 0), f)
    old_retired = current.retired
    current.retired = list(base.files)
    replaced = set(base.files)
    current.files = [done.name] + [f for f in current.files if f not in replaced]
    current.extra["dropped_through"] = base.compacted_ord
    current.extra["compacted_rows"] = done.rows
    since = int(current.extra.get("rows_since", 0)) - int(base.extra.get("rows_since", 0))
    current.extra["rows_since"] = max(0, since)
    current.compacted_ord = base.ord
    commit_manifest(table, current)
    # Only now: a reader of the previous manifest still finds what it names.
    delete_dirs(table, old_retired)
    _delete_orphans(table, current)
    return current


def _floor_column(floors: dict[int, int]) -> Any:
    """Each row's vbucket floor (0 when none): one flat map lookup, not a CASE per vbucket
    (1024 nested CASEs overflow the planner's stack)."""
    from pyspark.sql import functions as F

    if not floors:
        return F.lit(0).cast("long")
    pairs = [c for vb, f in sorted(floors.items()) for c in (F.lit(vb), F.lit(f).cast("long"))]
    found = F.try_element_at(F.create_map(*pairs), F.col("vbucket"))
    return F.coalesce(found, F.lit(0).cast("long"))


def delete_dirs(table: Path, names: Iterable[str]) -> None:
    for name in names:
        shutil.rmtree(table / name, ignore_errors=True)


def _delete_orphans(table: Path, manifest: Manifest) -> None:
    """Directories no manifest names: left by a batch that crashed before its commit. The
    table has one writer (the job calling this), so nothing else is still writing them."""
    named = {*manifest.files, *manifest.retired}
    data = table / "data"
    if not data.exists():
        return
    for child in data.iterdir():
        if f"data/{child.name}" not in named:
            shutil.rmtree(child, ignore_errors=True)


def table_bytes(table: Path, manifest: Manifest) -> int:
    """Bytes of the Parquet files the manifest names."""
    total = 0
    for name in manifest.files:
        for path in (table / name).rglob("*.parquet"):
            total += path.stat().st_size
    return total


def now() -> float:
    return time.time()


Transform = Callable[[Any], Any]

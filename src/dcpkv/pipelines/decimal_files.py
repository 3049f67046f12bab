"""Parquet written with the old ``DECIMAL(20,0)`` 64-bit columns, read as today's ``BIGINT``.

Theory of operation
-------------------
The source's 64-bit columns were ``DECIMAL(20,0)`` before they became ``BIGINT``
(``dcpkv.spark.rows``). Mirrors and views written then keep ``cas`` and ``vb_uuid`` as
decimals (their ``seqno`` was already a long), backups all six. Such output must stay
readable: a backup is history that cannot be made again, and a mirror rebuilt from scratch
costs a full read of the bucket. So every reader of stored rows goes through this module.

A directory is written by one Spark job (or one pyarrow write), so its files share one schema:
the footer of its first Parquet file tells which columns are decimals (one footer read per
directory, on the driver). Directories are grouped by that answer; today's are read exactly
as before, and a group of old ones with the decimal types in its read schema, each decimal
then turned into what the source makes now: a seqno by value, a bit-pattern column (``cas``,
``vb_uuid``) by its 64 bits (from 2**63 up, negative). The groups are unioned into one
DataFrame (or one pyarrow Table) of today's schema.

Nothing is rewritten here. A mirror or view leaves the old schema at its next compaction (it
rewrites the live rows into one new directory); a backup's runs are checksummed and never
change, so they are read through this for good.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from dcpkv.core.seqno import SEQNO_MAX
from dcpkv.spark.rows import BIT_PATTERN_COLUMNS, SEQNO_COLUMNS

OLD_TYPE = pa.decimal128(20, 0)
_U64_NAMES = frozenset((*BIT_PATTERN_COLUMNS, *SEQNO_COLUMNS))
_TWO_64 = 1 << 64


def decimal_columns(schema: pa.Schema) -> tuple[str, ...]:
    """The 64-bit columns ``schema`` stores the old way (as decimals)."""
    return tuple(f.name for f in schema if f.name in _U64_NAMES and pa.types.is_decimal(f.type))


def directory_decimals(directory: Path) -> tuple[str, ...]:
    """:func:`decimal_columns` of a written directory (none when it has no Parquet file)."""
    import pyarrow.parquet as pq

    first = next(iter(sorted(Path(directory).rglob("*.parquet"))), None)
    return () if first is None else decimal_columns(pq.read_schema(first))


def by_schema(directories: Iterable[Path]) -> dict[tuple[str, ...], list[Path]]:
    """The directories grouped by their decimal columns, in their order within each group."""
    groups: dict[tuple[str, ...], list[Path]] = {}
    for d in directories:
        groups.setdefault(directory_decimals(d), []).append(Path(d))
    return groups


# -- pyarrow ---------------------------------------------------------------------------------


def as_bigint(table: pa.Table) -> pa.Table:
    """``table`` with its old decimal 64-bit columns as today's int64 ones."""
    for name in decimal_columns(table.schema):
        i = table.schema.get_field_index(name)
        unsigned = table.column(i).cast(pa.uint64())
        if name in BIT_PATTERN_COLUMNS:
            column = pa.chunked_array([c.view(pa.int64()) for c in unsigned.chunks], pa.int64())
        else:
            column = unsigned.cast(pa.int64())  # a seqno beyond int64 fails here, loudly
        table = table.set_column(i, name, column)
    return table


def arrow_datasets(directories: Iterable[Path]) -> list[Any]:
    """One pyarrow dataset per schema over the directories' Parquet files (read each with
    :func:`as_bigint`)."""
    import pyarrow.dataset as ds

    out = []
    for group in by_schema(directories).values():
        files = [str(p) for d in group for p in sorted(d.rglob("*.parquet"))]
        if files:
            out.append(ds.dataset(files, format="parquet"))
    return out


# -- Spark -----------------------------------------------------------------------------------


def read(spark: Any, directories: Sequence[Path], schema: Any) -> Any:
    """``spark.read.schema(schema).parquet(*directories)``, old directories included."""
    frames = [
        _read_group(spark, group, schema, old) for old, group in by_schema(directories).items()
    ]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def _read_group(spark: Any, group: list[Path], schema: Any, old: tuple[str, ...]) -> Any:
    paths = [str(d) for d in group]
    if not old:
        return spark.read.schema(schema).parquet(*paths)
    from pyspark.sql import functions as F
    from pyspark.sql.types import DecimalType, StructField, StructType

    read_as = StructType(
        [StructField(f.name, DecimalType(20, 0)) if f.name in old else f for f in schema]
    )
    rows = spark.read.schema(read_as).parquet(*paths)
    return rows.select(*(F.expr(_cast_sql(f.name)) if f.name in old else f.name for f in schema))


def _cast_sql(name: str) -> str:
    """The SQL that turns an old decimal column into today's BIGINT (named as before)."""
    if name in BIT_PATTERN_COLUMNS:
        wrapped = f"IF(`{name}` > {SEQNO_MAX}, `{name}` - {_TWO_64}, `{name}`)"
        return f"CAST({wrapped} AS BIGINT) AS `{name}`"
    return f"CAST(`{name}` AS BIGINT) AS `{name}`"

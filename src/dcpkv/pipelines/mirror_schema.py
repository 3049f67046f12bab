"""The mirror's stored change rows: the source's columns as they are, and the stream position.

Beside the mirror's own module so that the first batch (``first_batch.py``), which the mirror
starts, writes the same rows without importing the mirror back.
"""

from __future__ import annotations

from typing import Any

from dcpkv.spark.rows import spark_fields

MIRROR_COLUMNS = ("op", "vbucket", "key", "value", "datatype", "flags", "expiry", "cas", "seqno",
                  "vb_uuid")  # fmt: skip


def mirror_schema() -> Any:
    """The stored change rows: the source's :data:`MIRROR_COLUMNS` as they are, and the
    stream position ``ord``, ``pos``."""
    from pyspark.sql.types import LongType, StructField, StructType

    position = [StructField("ord", LongType()), StructField("pos", LongType())]
    return StructType(spark_fields(*MIRROR_COLUMNS) + position)


def mirror_rows(df: Any) -> Any:
    """Source rows -> stored change rows (``ord``/``pos`` are stamped later)."""
    return df.select(*MIRROR_COLUMNS)

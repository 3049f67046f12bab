"""The change stream as a PySpark data source, the store as a sink.

Usage::

    import dcpkv.spark
    dcpkv.spark.register(spark)
    changes = spark.readStream.format("dcpkv").option("port", 11210).load()

docs/spark.md gives the options, the row schema and the sink.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make ``format("dcpkv")`` available in ``spark`` (a SparkSession); idempotent."""
    from dcpkv.spark.source import DcpkvDataSource

    spark.dataSource.register(DcpkvDataSource)


__all__ = ["register"]

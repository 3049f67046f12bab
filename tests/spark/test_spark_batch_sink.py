"""The batch source (documents and changes modes) and the sink, batch and streaming."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sparkhelp import Changelog, Workload, server_docs, vb

from support.topology import alone, set_topologies


def _reader(spark: Any, port: int, **options: Any) -> Any:
    reader = spark.read.format("dcpkv").option("port", port)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader


def test_documents_mode_equals_the_server(spark: Any, server: Any) -> None:
    work = Workload(server.port)
    work.run(500)
    truth = work.truth()
    rows = _reader(spark, server.port, mode="documents").load().collect()
    assert {bytes(r.key): bytes(r.value) for r in rows} == truth
    assert len(rows) == len(truth)  # one row per live key
    assert {r.op for r in rows} == {"mutation"}


def test_changes_mode_between_offsets_and_selected_vbuckets(spark: Any, server: Any) -> None:
    work = Workload(server.port)
    work.run(300)
    truth = work.truth()
    rows = _reader(spark, server.port, vbuckets="0-3").load().collect()
    assert {r.vbucket for r in rows} <= {0, 1, 2, 3}
    log = Changelog()
    log.apply(rows)
    assert log.live() == {k: v for k, v in truth.items() if vb(k) < 4}
    meta = _reader(spark, server.port, includeValues="false").load().collect()
    assert all(r.value is None and r.datatype is None for r in meta)
    assert len(meta) >= len(rows)


def test_sink_round_trip(spark: Any, server: Any) -> None:
    rows = [(f"doc-{i}", f"body-{i}".encode(), i, "mutation") for i in range(200)]
    rows += [(f"doc-{i}", None, 0, "deletion") for i in range(0, 200, 7)]
    df = spark.createDataFrame(rows, "key STRING, value BINARY, flags BIGINT, op STRING")
    df.coalesce(1).write.format("dcpkv").option("port", server.port).mode("append").save()
    expected = {f"doc-{i}".encode(): f"body-{i}".encode() for i in range(200) if i % 7}
    assert server_docs(server.port, {f"doc-{i}".encode() for i in range(200)}) == expected
    back = _reader(spark, server.port, mode="documents").load().collect()
    assert {bytes(r.key): bytes(r.value) for r in back} == expected
    assert {bytes(r.key): r.flags for r in back} == {k: int(k[4:]) for k in expected}


def test_sink_with_durability_on_a_single_node_topology(spark: Any, server: Any) -> None:
    """``durability`` makes the sink's writes SyncWrites: committed at PersistToMajority on
    vbuckets with a single-node topology; refused (the job fails, nothing written) where
    there is none."""
    set_topologies(server.port, alone(server.port, range(8)))
    rows = [(f"durable-{i}", f"body-{i}".encode(), "mutation") for i in range(100)]
    rows += [(f"durable-{i}", None, "deletion") for i in range(0, 100, 5)]
    df = spark.createDataFrame(rows, "key STRING, value BINARY, op STRING")
    sink = df.coalesce(1).write.format("dcpkv").option("port", server.port)
    sink.option("durability", "persistToMajority").mode("append").save()
    keys = {f"durable-{i}".encode() for i in range(100)}
    expected = {f"durable-{i}".encode(): f"body-{i}".encode() for i in range(100) if i % 5}
    assert server_docs(server.port, keys) == expected


def test_sink_with_durability_and_no_topology_fails(spark: Any, server: Any) -> None:
    df = spark.createDataFrame([("k", b"v")], "key STRING, value BINARY")
    sink = df.coalesce(1).write.format("dcpkv").option("port", server.port)
    with pytest.raises(Exception, match="DurabilityImpossible"):
        sink.option("durability", "majority").mode("append").save()
    assert server_docs(server.port, {b"k"}) == {}


def test_sink_refuses_a_dataframe_without_a_key(spark: Any, server: Any) -> None:
    df = spark.createDataFrame([("x",)], "value STRING")
    with pytest.raises(Exception, match="key column"):
        df.write.format("dcpkv").option("port", server.port).mode("append").save()


def test_streaming_sink_mirrors_a_bucket(spark: Any, server_factory: Any, tmp_path: Path) -> None:
    source = server_factory(tmp_path / "a", tmp_path / "a.log", "--vbuckets", "8")
    target = server_factory(tmp_path / "b", tmp_path / "b.log", "--vbuckets", "8")
    work = Workload(source.start())
    target.start()
    work.run(400)
    truth = work.truth()
    query = (
        spark.readStream.format("dcpkv")
        .option("port", source.port)
        .load()
        .writeStream.format("dcpkv")
        .option("port", target.port)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    assert server_docs(target.port, work.keys) == truth

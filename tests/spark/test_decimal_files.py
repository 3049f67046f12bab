"""Output written with the old DECIMAL(20,0) 64-bit columns, read by today's BIGINT schema:
a mirror (and its compaction), a backup (restored), and docs/spark.md's unsigned expression."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sparkhelp import Workload, server_docs

from dcpkv.client.settings import ConnectionSettings
from dcpkv.pipelines import decimal_files, vtable
from dcpkv.pipelines.backup import restore, run_backup
from dcpkv.pipelines.backup_layout import MANIFEST, committed_runs, file_entries, verify
from dcpkv.pipelines.mirror import compact_mirror, mirror_doc_count, read_mirror
from dcpkv.pipelines.mirror_schema import mirror_schema
from dcpkv.spark.rows import BIT_PATTERN_COLUMNS
from support.serverproc import ServerProcess

OLD = pa.decimal128(20, 0)
TOP = 2**64 - 1


def _as_old(table: pa.Table, names: tuple[str, ...]) -> pa.Table:
    """``table`` with its int64 columns ``names`` stored the old way: the unsigned value as a
    decimal (what the previous version wrote)."""
    for name in names:
        i = table.schema.get_field_index(name)
        values = [
            None if v is None else Decimal(v % 2**64 if name in BIT_PATTERN_COLUMNS else v)
            for v in table.column(i).to_pylist()
        ]
        table = table.set_column(i, name, pa.array(values, OLD))
    return table


def _mirror_dir(table: Path, name: str, rows: list[dict[str, Any]], old: bool) -> str:
    types = {"op": pa.string(), "vbucket": pa.int32(), "key": pa.binary(), "value": pa.binary(),
             "datatype": pa.int32(), "flags": pa.int64(), "expiry": pa.int64(),
             "cas": pa.int64(), "seqno": pa.int64(), "vb_uuid": pa.int64(), "ord": pa.int64(),
             "pos": pa.int64()}  # fmt: skip
    data = pa.table({c: pa.array([r[c] for r in rows], t) for c, t in types.items()})
    if old:  # the old mirror: cas and vb_uuid decimals, its seqno already a long
        data = _as_old(data, ("cas", "vb_uuid"))
    (table / name).mkdir(parents=True)
    pq.write_table(data, table / name / "part-00000.parquet")
    return name


def _signed(value: int) -> int:
    return value - 2**64 if value >= 2**63 else value


def _row(key: bytes, seqno: int, cas: int, ord_: int, pos: int, uuid: int = TOP - 1) -> dict:
    """A stored change row; ``cas`` and ``uuid`` are u64s, stored as their bits."""
    return {"op": "mutation", "vbucket": 3, "key": key, "value": b"v" + key, "datatype": 0,
            "flags": 0, "expiry": 0, "cas": _signed(cas), "seqno": seqno,
            "vb_uuid": _signed(uuid), "ord": ord_, "pos": pos}  # fmt: skip


def test_an_old_mirror_reads_as_bigint_and_leaves_the_old_schema_when_compacted(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "m"
    cas_a, cas_b = 2**63 + 11, 1_700_000_000_000_000_000  # a CAS set with meta, an HLC time
    old = _mirror_dir(path, "data/b00000001-old", [
        _row(b"a", 5, cas_a, 1, 0), _row(b"b", 6, 9, 1, 1), _row(b"c", 7, TOP, 1, 2),
    ], old=True)  # fmt: skip
    new = _mirror_dir(path, "data/b00000002-new", [_row(b"b", 8, cas_b, 2, 0)], old=False)
    assert decimal_files.directory_decimals(path / old) == ("cas", "vb_uuid")
    assert decimal_files.directory_decimals(path / new) == ()
    vtable.commit_manifest(path, vtable.Manifest(ord=2, batch_id=1, files=[old, new]))

    want = {b"a": (5, cas_a - 2**64), b"b": (8, cas_b), b"c": (7, -1)}
    docs = {bytes(r.key): (r.seqno, r.cas) for r in read_mirror(spark, path).collect()}
    assert docs == want
    live = vtable.live_changes(spark, path, vtable.load_manifest(path), mirror_schema())
    assert {r.vb_uuid for r in live.collect()} == {-2}
    current = vtable.current_arrow(path, vtable.load_manifest(path), ["cas", "vb_uuid"])
    assert current.schema.field("cas").type == pa.int64()
    assert dict(zip(current["key"].to_pylist(), current["cas"].to_pylist(), strict=True)) == {
        k: c for k, (_s, c) in want.items()
    }
    assert mirror_doc_count(path) == 3

    compacted = compact_mirror(spark, path, persisted={})
    assert [decimal_files.directory_decimals(path / f) for f in compacted.files] == [()]
    docs = {bytes(r.key): (r.seqno, r.cas) for r in read_mirror(spark, path).collect()}
    assert docs == want


def test_the_readme_expression_gives_the_unsigned_value(spark: Any) -> None:
    values = [0, 5, 2**63 - 1, -(2**63), -1]
    df = spark.createDataFrame([(v,) for v in values], "cas BIGINT")
    got = df.selectExpr("pmod(cast(cas as decimal(20,0)), 18446744073709551616) AS u").collect()
    assert [int(r.u) for r in got] == [0, 5, 2**63 - 1, 2**63, TOP]


def test_an_old_backup_restores(
    spark: Any, server: ServerProcess, server_factory: Any, tmp_path: Path
) -> None:
    """A backup whose runs hold the six 64-bit columns as decimals (the previous version's)
    verifies and restores as it did."""
    work = Workload(server.port)
    work.run(300)
    root = tmp_path / "backup"
    ep = ConnectionSettings.at(port=server.port)
    run_backup(spark, root, ep)
    work.run(120, prefix="k2")
    run_backup(spark, root, ep)
    truth = work.truth()
    for run in committed_runs(root):  # rewrite every run as the previous version wrote it
        for part in run.data.glob("*.parquet"):
            names = ("cas", "rev_seqno", "seqno", "vb_uuid", "snap_start", "snap_end")
            pq.write_table(_as_old(pq.read_table(part), names), part)
            (part.parent / f".{part.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum
        run.manifest["files"] = file_entries(run.data)
        (run.path / MANIFEST).write_text(json.dumps(run.manifest, indent=1))
    assert verify(root) == []
    assert all(
        decimal_files.directory_decimals(r.data) == ("cas", "rev_seqno", "seqno", "vb_uuid",
                                                     "snap_start", "snap_end")
        for r in committed_runs(root)
    )  # fmt: skip
    target = server_factory(tmp_path / "t", tmp_path / "t.log", "--vbuckets", "8")
    target.start()
    restore(spark, root, ConnectionSettings.at(port=target.port))
    assert server_docs(target.port, work.keys) == truth


def test_the_summary_job_leaves_negative_cas_out_of_the_oldest(spark: Any, tmp_path: Path) -> None:
    """A batch with a rollback row is summarised by a Spark job; a CAS from 2**63 up (negative
    as BIGINT) is no clock time, so the oldest change is the smallest non-negative CAS."""
    rows = [_row(b"a", 5, 2**64 - 3, 1, 0), _row(b"b", 6, 70, 1, 1), _row(b"c", 7, 80, 1, 2)]
    rows.append(dict(_row(b"", 4, 0, 1, 3), op="rollback", key=None, cas=None))
    name = _mirror_dir(tmp_path, "data/b1", rows, old=False)
    summary = vtable.batch_summary(spark, tmp_path, name)
    assert summary.oldest_cas == 70 and [r.seqno for r in summary.rollbacks] == [4]

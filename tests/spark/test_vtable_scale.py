"""The versioned table at the scale of a real bucket: 1024 vbuckets, a rollback entry each.

A crash on a full-size bucket leaves one rollback entry per vbucket and a floor per vbucket;
the kill rule and the floors must stay flat for Spark's planner (an OR or CASE per vbucket
overflowed the JVM stack in the main job).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

from dcpkv.pipelines import vtable
from dcpkv.pipelines.mirror_schema import mirror_schema

VBUCKETS = 1024


def _row(vb: int, seqno: int, ord_: int, pos: int, op: str = "mutation") -> tuple:
    key = f"k{vb}-{seqno % 2}".encode()
    return (op, vb, key, b"v", 0, 0, 0, None, seqno, None, ord_, pos)


def test_thousand_entries_and_floors_stay_plannable(spark: Any, tmp_path: Path) -> None:
    schema = mirror_schema()
    extra = [f.name for f in schema.fields][12:]
    rows = []
    for vb in range(VBUCKETS):
        # seqnos 1..4 in batch 1 (keys alternate), then a rollback to 2 in batch 2.
        rows += [_row(vb, s, 1, s) for s in range(1, 5)]
    df = spark.createDataFrame([r + (None,) * len(extra) for r in rows], schema)
    table = tmp_path / "t"
    table.mkdir()
    manifest = vtable.Manifest(ord=2)
    manifest.files = [vtable.write_rows(table, df, "b1")]
    manifest.entries = [vtable.Entry("rollback", vb, 2, 2, 0) for vb in range(VBUCKETS)]
    live = vtable.live_changes(spark, table, manifest, schema)
    assert live.count() == VBUCKETS * 2  # seqnos 3 and 4 of every vbucket are dead
    assert live.filter("seqno > 2").count() == 0

    floors = {vb: 1 for vb in range(VBUCKETS)}
    compacted = vtable.compact(spark, table, manifest, schema, floors)
    kept = vtable.live_changes(spark, table, compacted, schema)
    # per vbucket two keys: k-1 (seqno 1, latest) and k-0 (seqno 2, latest): both kept
    assert kept.count() == VBUCKETS * 2
    assert compacted.floors[0] == 1 and len(compacted.floors) == VBUCKETS


def test_the_spark_kill_rule_is_the_row_rule(spark: Any, tmp_path: Path) -> None:
    """``live_changes`` (a Spark join) keeps exactly the rows ``vtable.is_dead`` keeps, on
    random rows and entries: rollbacks, resync-style rollback+skip pairs, lone skips."""
    rng = random.Random(15)
    schema = mirror_schema()
    extra = [f.name for f in schema.fields][12:]
    places = [(o, p) for o in range(1, 7) for p in range(0, 40, 3)]
    rows = [
        _row(vb, rng.randint(1, 50), *rng.choice(places)) for vb in range(3) for _ in range(150)
    ]
    entries = []
    for _ in range(14):
        vb, (o, p) = rng.randrange(3), rng.choice(places)
        kind = rng.choice(["rollback", "resync", "skip"])
        if kind == "resync":
            entries += [vtable.Entry("rollback", vb, -1, o, p), vtable.Entry("skip", vb, 30, o, p)]
        else:
            entries.append(vtable.Entry(kind, vb, rng.randint(-1, 40), o, p))
    df = spark.createDataFrame([r + (None,) * len(extra) for r in rows], schema)
    table = tmp_path / "t"
    table.mkdir()
    manifest = vtable.Manifest(ord=6, entries=entries)
    manifest.files = [vtable.write_rows(table, df, "b1")]
    live = vtable.live_changes(spark, table, manifest, schema)
    got = Counter((r.vbucket, int(r.seqno), r.ord, r.pos) for r in live.collect())
    reach = vtable.scopes(entries)
    expected = Counter(
        (r[1], r[8], r[10], r[11])
        for r in rows
        if not vtable.is_dead(r[1], r[8], r[10], r[11], reach)
    )
    assert got == expected
    assert sum(expected.values()) < len(rows)  # the entries killed something


def test_the_driver_rewrite_keeps_what_the_spark_rewrite_keeps(spark: Any, tmp_path: Path) -> None:
    """``vtable.rewrite`` on the driver (pyarrow) and in Spark keep the same rows: random
    histories of a few keys per vbucket (deletions, expirations among them), rollback and
    resync entries, floors, and a previous compaction's ord for the old-deletion rule."""
    rng = random.Random(16)
    schema = mirror_schema()
    extra = [f.name for f in schema.fields][12:]
    rows = []
    for vb in range(4):
        seqnos = rng.sample(range(1, 400), 120)
        for seqno in seqnos:
            op = rng.choice(["mutation"] * 6 + ["deletion", "expiration"])
            key = f"k{vb}-{rng.randrange(9)}".encode()
            ord_ = 1 + seqno // 60  # ords ascend with seqnos, as in a stream
            rows.append((op, vb, key, b"v", 0, 0, 0, None, seqno, None, ord_, seqno))
    entries = [
        vtable.Entry("rollback", 1, 150, 4, 500),
        vtable.Entry("rollback", 2, -1, 5, 10),
        vtable.Entry("skip", 2, 260, 5, 10),
    ]
    df = spark.createDataFrame([r + (None,) * len(extra) for r in rows], schema)
    table = tmp_path / "t"
    table.mkdir()
    manifest = vtable.Manifest(ord=7, compacted_ord=3, entries=entries)
    manifest.files = [vtable.write_rows(table, df, "b1")]
    floors = {0: 200, 1: 120, 2: 300}  # vbucket 3: no floor
    kept = {}
    for on_driver in (True, False):
        done = vtable.rewrite(spark, table, manifest, schema, floors, on_driver=on_driver)
        out = spark.read.schema(schema).parquet(str(table / done.name)).collect()
        kept[on_driver] = sorted(
            (r.vbucket, bytes(r.key), r.seqno, r.ord, r.pos, r.op) for r in out
        )
    assert kept[True] == kept[False]
    assert 0 < len(kept[True]) < len(rows) - 100  # the rule dropped plenty, kept some

"""Incremental map/reduce views against a real server and the shared local Spark session.

The truth is always the map/reduce recomputed from the server's documents (KV gets)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from sparkhelp import server_docs, vb

from dcpkv.core.status import Status
from dcpkv.pipelines import example_views, vtable
from dcpkv.pipelines.mirror import start_mirror
from dcpkv.pipelines.sample_data import changes, documents
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.views import create_view, query_view, start_view, stats
from dcpkv.protocol.constants import Opcode
from support.kvclient import KVClient

MAP = "dcpkv.pipelines.example_views:revenue_by_country"


class Shop:
    """Sample documents written through the KV protocol; remembers every key."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.keys: set[bytes] = set()
        self.updates = changes(300, seed=3)

    def load(self, total: int) -> None:
        self.write(documents(total, seed=5))

    def update(self, count: int) -> None:
        self.write(next(self.updates) for _ in range(count))

    def write(self, pairs: Any) -> None:
        with KVClient(self.port) as kv:
            assert kv.login().status == Status.Success
            for key, doc in pairs:
                self.keys.add(key)
                if doc is None:
                    kv.call(Opcode.Delete, key=key, vbucket=vb(key))
                else:
                    assert kv.set(key, doc, vbucket=vb(key)).status == Status.Success

    def revenue(self, group: bool) -> list[dict[str, Any]]:
        """sum of revenue_by_country over the server's documents."""
        sums: dict[str, float] = defaultdict(float)
        for key, value in server_docs(self.port, self.keys).items():
            for k, v in example_views.revenue_by_country(key.decode(), json.loads(value)):
                sums[k] += v
        if not group:
            return [{"key": None, "value": sum(sums.values())}] if sums else []
        return [{"key": k, "value": sums[k]} for k in sorted(sums)]


def approx(rows: list[dict[str, Any]]) -> list[tuple[Any, float]]:
    return [(r["key"], round(r["value"], 6)) for r in rows]


def run_once(query: Any) -> None:
    query.awaitTermination()
    assert query.exception() is None, query.exception()


def test_view_follows_updates_deletes_and_restarts(spark: Any, server: Any, tmp_path: Path) -> None:
    shop = Shop(server.port)
    shop.load(300)
    views = tmp_path / "views"
    create_view(views, "revenue", MAP, "sum")
    src = SourceSettings.at(port=server.port)
    run_once(start_view(spark, views, "revenue", src, available_now=True))
    assert approx(query_view(None, views, "revenue", group=True)) == approx(shop.revenue(True))
    shop.update(200)  # updates and deletes
    run_once(start_view(spark, views, "revenue", src, available_now=True))  # from its checkpoint
    assert approx(query_view(None, views, "revenue", group=True)) == approx(shop.revenue(True))
    assert approx(query_view(None, views, "revenue")) == approx(shop.revenue(False))
    one = query_view(None, views, "revenue", key="France", group=True)
    assert approx(one) == [r for r in approx(shop.revenue(True)) if r[0] == "France"]


def test_view_on_a_mirror_and_stale_false(spark: Any, server: Any, tmp_path: Path) -> None:
    shop = Shop(server.port)
    shop.load(200)
    views, mirror = tmp_path / "views", tmp_path / "mirror"
    create_view(views, "statuses", "dcpkv.pipelines.example_views:orders_by_status", "count")
    src = SourceSettings.at(port=server.port)
    run_once(start_mirror(spark, src, mirror, available_now=True))
    run_once(start_view(spark, views, "statuses", mirror, available_now=True))
    truth = server_docs(server.port, shop.keys)
    counts: dict[str, int] = defaultdict(int)
    for k, v in truth.items():
        for status, _one in example_views.orders_by_status(k.decode(), json.loads(v)):
            counts[status] += 1
    got = query_view(None, views, "statuses", group=True)
    assert got == [{"key": s, "value": counts[s]} for s in sorted(counts)]


def test_stats_reduce() -> None:
    assert stats([1, 2, 3]) == {"sum": 6, "count": 3, "min": 1, "max": 3, "sumsqr": 14}


def test_stale_false_waits_for_the_changes_before_the_query(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    shop = Shop(server.port)
    shop.load(100)
    views = tmp_path / "views"
    create_view(views, "revenue", MAP, "sum")
    src = SourceSettings.at(port=server.port)
    query = start_view(spark, views, "revenue", src, trigger_seconds=0.2)
    try:
        for _round in range(2):
            shop.update(60)
            got = query_view(None, views, "revenue", group=True, stale="false", source=src)
            assert approx(got) == approx(shop.revenue(True))
    finally:
        query.stop()


def test_a_view_applied_inside_the_mirrors_batches(spark: Any, server: Any, tmp_path: Path) -> None:
    """The demo's shape: one query, the view following each mirror batch right after its
    commit; a view fed by the server before is rebuilt from the mirror. The view equals the
    map of the server's documents, and the driver-side document count equals the mirror's."""
    from dcpkv.pipelines.mirror import mirror_doc_count, read_mirror
    from dcpkv.pipelines.views.definition import view_schema
    from dcpkv.pipelines.views.job import view_follower

    shop = Shop(server.port)
    shop.load(200)
    views, mirror = tmp_path / "views", tmp_path / "mirror"
    create_view(views, "revenue", MAP, "sum")
    src = SourceSettings.at(port=server.port)
    run_once(start_view(spark, views, "revenue", src, available_now=True))  # the old way
    for _round in range(2):
        shop.update(120)  # updates and deletes
        follower = view_follower(spark, views, "revenue", mirror)
        run_once(start_mirror(spark, src, mirror, available_now=True, after_commit=follower.follow))
        assert approx(query_view(None, views, "revenue", group=True)) == approx(shop.revenue(True))
        files = vtable.load_manifest(views / "revenue").files
        assert files and all(f.startswith("data/m") for f in files)  # the server's rows went
    manifest = vtable.load_manifest(views / "revenue")  # written by pyarrow, read by Spark:
    vtable.compact(spark, views / "revenue", manifest, view_schema(), {})
    assert vtable.load_manifest(views / "revenue").files[0].startswith("data/c")
    assert approx(query_view(None, views, "revenue", group=True)) == approx(shop.revenue(True))
    assert (
        mirror_doc_count(mirror)
        == read_mirror(spark, mirror).count()
        == len(server_docs(server.port, shop.keys))
    )

"""The one summary table that ends ``make bench``: issue 15's targets against this run's figures.

Theory of operation
-------------------
Every benchmark of the run wrote ``RESULTS/NAME.json`` (``{"bench", "figures", ...}``, see
``bench/_report.py``), and ``bench/peers.py`` wrote ``RESULTS/peer_NAME.json`` for each peer on
PATH (the peer scripts' own shape: ``{"peer", "median", ...}``). A row of :data:`ROWS` names a
figure, its target (at least / at most a bound; a bound may depend on another figure, as "4
connections >= 1.5x one") and the peers' figures it compares with. The table shows the figure,
the target, whether it is met, and per peer its figure and dcpkv / peer, all from the files of
this run only; a figure whose benchmark did not run shows as "-", a missing peer is left out.

Figures are read by a ``(source, metric)`` pair: source ``"kv"`` is ``kv.json``'s
``figures``, ``"peer:redis"`` is ``peer_redis.json``'s ``median``, and ``"latency:redis"`` is
``latency.json``'s ``peer.redis`` (a peer a benchmark ran itself, at its own parameters).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

Ref = tuple[str, str]  # (source, metric)
Figures = dict[str, dict[str, float]]


@dataclass(frozen=True)
class Target:
    """``figure >= bound`` (at_least) or ``figure <= bound``; bound may be computed."""

    at_least: bool
    bound: float | Callable[[Figures], float | None]
    text: str

    def resolve(self, figures: Figures) -> float | None:
        return self.bound(figures) if callable(self.bound) else self.bound

    def met(self, value: float, figures: Figures) -> bool | None:
        bound = self.resolve(figures)
        if bound is None or math.isnan(value):
            return None
        return value >= bound if self.at_least else value <= bound


def at_least(bound: float, text: str) -> Target:
    return Target(True, bound, text)


def at_most(bound: float, text: str) -> Target:
    return Target(False, bound, text)


def _times_set_1conn(factor: float) -> Callable[[Figures], float | None]:
    def bound(figures: Figures) -> float | None:
        one = figures.get("kv", {}).get("set_ops_per_s_1conn")
        return None if one is None else factor * one

    return bound


@dataclass(frozen=True)
class Row:
    what: str
    figure: Ref
    target: Target | None = None
    peers: list[tuple[str, Ref]] = field(default_factory=list)


MEMCACHED_SAME_CLIENT = "memcached, same client"
RSS_ALLOWED = at_most(1.0, "<= 1 (1.25x quota + 16 MiB)")  # the README's data-server section
REDIS_PACED = "Redis Streams, same pacing"
# bench/spark_floor.py: the same query over a source that costs nothing (Spark's own limit)
SPARK_FLOOR = "Spark alone (pre-built batches)"

# The targets table of issue 15, then its two defects, then the memory figure (issue 15 item 5),
# then issue 16's consumer targets.
ROWS: list[Row] = [
    Row("KV pipelined Set, 1 conn, ops/s", ("kv", "set_ops_per_s_1conn"),
        at_least(120_000, ">= 120k"),
        [(MEMCACHED_SAME_CLIENT, ("kv", "memcached_set_ops_per_s_1conn")),
         ("memcached, raw client", ("peer:memcached", "set_pipelined"))]),
    # (no target: what the flusher sustains, the Set phase's writes over the time until the
    # last of them was on disk)
    Row("KV Set, 1 conn, until all persisted, ops/s", ("kv", "set_persisted_ops_per_s_1conn")),
    Row("KV pipelined Get, 1 conn, ops/s", ("kv", "get_ops_per_s_1conn"),
        at_least(250_000, ">= 250k"),
        [(MEMCACHED_SAME_CLIENT, ("kv", "memcached_get_ops_per_s_1conn")),
         ("memcached, raw client", ("peer:memcached", "get_pipelined"))]),
    Row("KV Set, 4 conns, ops/s", ("kv", "set_ops_per_s_4conn"),
        at_least(_times_set_1conn(1.5), ">= 1.5x 1 conn"),
        [(MEMCACHED_SAME_CLIENT, ("kv", "memcached_set_ops_per_s_4conn"))]),
    Row("KV Set, 4 conns, until all persisted, ops/s", ("kv", "set_persisted_ops_per_s_4conn")),
    # (no target: the same Set at the other end of a bucket's growth, bench/kv_growth.py)
    Row("KV Set, 1 conn, first 100k of 1M keys, ops/s", ("kv_growth", "first_set_ops_per_s")),
    Row("KV Set, 1 conn, last 100k of 1M keys, ops/s", ("kv_growth", "last_set_ops_per_s")),
    Row("DCP backfill 1M, 1 conn, items/s", ("dcp", "backfill_items_per_s"),
        at_least(400_000, ">= 400k"),
        [("PostgreSQL pgoutput, pg_recvlogical", ("peer:postgresql", "recvlogical_pgoutput")),
         ("Redis XREAD, redis-py", ("peer:redis", "backfill_xread_redispy")),
         ("Redis XREAD, hiredis", ("peer:redis", "backfill_xread_raw_hiredis"))]),
    Row("DCP live, concurrent writer, items/s", ("dcp", "live_items_per_s"),
        at_least(100_000, ">= 100k"),
        [("Redis live tail", ("peer:redis", "tail_max_rate"))]),
    Row("DCP backfill, server CPU us/item", ("dcp", "backfill_server_cpu_us_per_item")),
    Row("warm-up of 1M items, s", ("dcp", "warmup_s")),
    Row("on disk per item (16+100 B), bytes", ("dcp", "disk_bytes_per_item")),
    Row("ack->received p50 @10k/s, ms", ("latency", "ack_p50_ms_10k"), at_most(1.0, "<= 1 ms")),
    Row("ack->received p99 @10k/s, ms", ("latency", "ack_p99_ms_10k"), at_most(5.0, "<= 5 ms")),
    Row("ack->received p999 @10k/s, ms", ("latency", "ack_p999_ms_10k")),
    Row("ack->received p50 @50k/s, ms", ("latency", "ack_p50_ms_50k"), at_most(1.0, "<= 1 ms")),
    Row("ack->received p99 @50k/s, ms", ("latency", "ack_p99_ms_50k"), at_most(5.0, "<= 5 ms")),
    Row("ack->received p999 @50k/s, ms", ("latency", "ack_p999_ms_50k")),
    # (no target: the server's cost of the paced loads, 1,024 vbuckets, one DCP consumer)
    Row("server CPU per write @10k/s, us", ("latency", "server_cpu_us_per_write_10k")),
    Row("server disk written per write @10k/s, kB", ("latency", "server_disk_kb_per_write_10k")),
    Row("server CPU per write @50k/s, us", ("latency", "server_cpu_us_per_write_50k")),
    Row("server disk written per write @50k/s, kB", ("latency", "server_disk_kb_per_write_50k")),
    Row("sent->received p50 @10k/s, ms", ("latency", "sent_p50_ms_10k"), None,
        [(REDIS_PACED, ("latency:redis", "sent_p50_ms_10k"))]),
    Row("sent->received p99 @10k/s, ms", ("latency", "sent_p99_ms_10k"), None,
        [(REDIS_PACED, ("latency:redis", "sent_p99_ms_10k"))]),
    Row("sent->received p50 @50k/s, ms", ("latency", "sent_p50_ms_50k"), None,
        [(REDIS_PACED, ("latency:redis", "sent_p50_ms_50k"))]),
    Row("sent->received p99 @50k/s, ms", ("latency", "sent_p99_ms_50k"), None,
        [(REDIS_PACED, ("latency:redis", "sent_p99_ms_50k"))]),
    Row("codec parse+decode, msgs/s", ("codec", "parse_decode_msgs_per_s"),
        at_least(1_000_000, ">= 1M"),
        [("pure-Python floor, full decode", ("peer:python-floor", "dcp_mutation.decode_full"))]),
    # the path DCP mutations take in the client (protocol/fast_dcp.py), beside the generic one
    Row("  fused DCP mutation path, msgs/s", ("codec", "parse_decode_fused_msgs_per_s"),
        at_least(1_000_000, ">= 1M"),
        [("pure-Python floor, full decode", ("peer:python-floor", "dcp_mutation.decode_full"))]),
    Row("Set rate, 1024 streams / none", ("fanout", "streamed_over_alone"),
        at_least(0.8, ">= 0.8x")),
    Row("acked->persisted p50, streamed, s", ("fanout", "persist_p50_s_streamed"),
        at_most(0.5, "<= 0.5 s")),
    Row("acked->persisted max, streamed, s", ("fanout", "persist_max_s_streamed"),
        at_most(2.0, "<= 2 s")),
    # The second defect is this phase: the 1024 streams AND a background writer that
    # saturates the loop ("the flusher must get its share whatever the load").
    Row("acked->persisted p50, streamed + saturating writer, s",
        ("fanout", "persist_p50_s_loaded"), at_most(0.5, "<= 0.5 s")),
    Row("acked->persisted max, streamed + saturating writer, s",
        ("fanout", "persist_max_s_loaded"), at_most(2.0, "<= 2 s")),
    # Issue 36: one Set at a time (an SDK call), two servers side by side in the same moments.
    Row("stop-and-wait Set, no streams, Sets/s", ("fanout", "rtt_sets_per_s_alone")),
    Row("  1024 streams open, Sets/s", ("fanout", "rtt_sets_per_s_streamed_1024")),
    Row("stop-and-wait Set rate, 1024 streams / none", ("fanout", "rtt_rate_streamed_over_alone"),
        at_least(0.8, ">= 0.8x")),
    Row("stop-and-wait round trip p50, no streams, us", ("fanout", "rtt_p50_us_alone")),
    Row("  1024 streams open, us", ("fanout", "rtt_p50_us_streamed_1024")),
    Row("stop-and-wait round trip p99, no streams, us", ("fanout", "rtt_p99_us_alone")),
    Row("  1024 streams open, us", ("fanout", "rtt_p99_us_streamed_1024")),
    Row("stop-and-wait round trip p99, 1024 streams / none",
        ("fanout", "rtt_p99_streamed_over_alone"), at_most(2.0, "<= 2x")),
    Row("RSS per item (16+100 B), bytes", ("memory", "rss_bytes_per_item")),
    Row("bucket mem_used / RSS growth", ("memory", "mem_used_over_rss_growth")),
    Row("peak RSS growth / allowed, 100 B values",
        ("memory", "quota_rss_growth_over_allowed_100b"), RSS_ALLOWED),
    Row("peak RSS growth / allowed, 4 KiB values",
        ("memory", "quota_rss_growth_over_allowed_4096b"), RSS_ALLOWED),
    Row("rebalance 2 -> 3 nodes, s", ("rebalance", "rebalance_s")),
    Row("writes/s before / during rebalance", ("rebalance", "before_writes_per_s")),
    Row("  during", ("rebalance", "during_writes_per_s")),
    Row("write p99 before / during rebalance, ms", ("rebalance", "before_p99_ms")),
    Row("  during", ("rebalance", "during_p99_ms")),
    Row("client Consumer to now, items/s", ("stream", "consumer_items_per_s"),
        at_least(300_000, ">= 300k"),
        [("Redis XREAD, redis-py", ("peer:redis", "backfill_xread_redispy"))]),
    Row("dcpkv stream --format json, items/s", ("stream", "cli_json_items_per_s"),
        at_least(150_000, ">= 150k")),
    Row("SyncConsumer to now, items/s", ("spark", "sync_consumer_rows_per_s"),
        at_least(200_000, ">= 200k")),
    Row("Spark AvailableNow -> Parquet, rows/s", ("spark", "query_rows_per_s"),
        at_least(150_000, ">= 150k"), [(SPARK_FLOOR, ("spark_floor", "floor_query_rows_per_s"))]),
    Row("  the same query again (warm), rows/s", ("spark", "query_warm_rows_per_s"), None,
        [(SPARK_FLOOR, ("spark_floor", "floor_query_warm_rows_per_s"))]),
    Row("demo mirror lag p50 @1k changes/s, s", ("demo", "lag_p50_s"), at_most(2.0, "<= 2 s")),
    Row("demo mirror lag p99 @1k changes/s, s", ("demo", "lag_p99_s"), at_most(5.0, "<= 5 s")),
    Row("demo first batch (30k docs), rows/s", ("demo", "first_batch_rows_per_s"),
        at_least(50_000, ">= 50k")),
]  # fmt: skip


def load(results: Path) -> Figures:
    """Every figure of the run, by source (see the module docstring)."""
    figures: Figures = {}
    for path in sorted(results.glob("*.json")):
        body = json.loads(path.read_text())
        if "bench" in body:
            figures[body["bench"]] = body["figures"]
            for peer, values in body.get("peer", {}).items():
                figures[f"{body['bench']}:{peer}"] = values
        elif "peer" in body:
            figures[f"peer:{body['peer']}"] = body["median"]
    return figures


def _get(figures: Figures, ref: Ref) -> float | None:
    value = figures.get(ref[0], {}).get(ref[1])
    return None if value is None else float(value)


def fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def table(figures: Figures) -> Table:
    out = Table(title="make bench: issues 15 and 16 targets (dcpkv / peer from the same run)")
    for col in ("metric", "dcpkv", "target", "met", "peer", "peer figure", "dcpkv / peer"):
        out.add_column(col, justify="left" if col in ("metric", "target", "peer") else "right")
    for row in ROWS:
        value = _get(figures, row.figure)
        met = None if value is None or row.target is None else row.target.met(value, figures)
        cells = [
            row.what,
            fmt(value),
            row.target.text if row.target else "",
            {True: "yes", False: "NO", None: "-" if row.target else ""}[met],
        ]
        peers = [(name, _get(figures, ref)) for name, ref in row.peers]
        peers = [(name, p) for name, p in peers if p is not None]
        if not peers:
            out.add_row(*cells, "", "", "")
        for i, (name, peer) in enumerate(peers):
            ratio = value / peer if value is not None and peer else None
            out.add_row(*(cells if i == 0 else [""] * 4), name, fmt(peer), fmt(ratio))
    return out


def main(
    results: Annotated[Path, typer.Argument(help="folder of this run's JSON files")] = Path(
        "bench/results"
    ),
) -> None:
    figures = load(results)
    if not figures:
        raise SystemExit(f"no benchmark JSON in {results}")
    Console(width=150).print(table(figures))


if __name__ == "__main__":
    typer.run(main)

"""The one summary that ends ``make bench``: ratios first, then issue 15's targets and the
absolute figures with their yardstick, from this run's files only.

Theory of operation
-------------------
Every benchmark of the run wrote ``RESULTS/NAME.json`` (``{"bench", "figures", "yardstick",
...}``, see ``bench/_report.py``), and ``bench/peers.py`` wrote ``RESULTS/peer_NAME.json`` for
each peer on PATH (the peer scripts' own shape: ``{"peer", "median", ...}``); ``make bench``
also wrote ``machine.json`` (``bench/machine.py``) and the yardstick before and after
everything (``yardstick_start.json``, ``yardstick_end.json``). A row of :data:`ROWS` names a
figure, its target (at least / at most a bound; a bound may depend on another figure, as "4
connections >= 1.5x one") and the peers' figures it compares with.

The summary opens with warnings when the run's two yardstick timings, or a benchmark's own
two, differ by more than 20 % (the machine changed speed: those ratios are uncertain), then
the machine and the versions it ran with. Then the table: per row its ratios first (a
throughput over its benchmark's yardstick, the higher of the timings around that benchmark;
dcpkv / each peer), then the target and whether it is met, then the absolute figures and the
yardstick they go with. A figure whose benchmark did not run shows as "-", a missing peer is
left out. ``--markdown PATH`` writes the same summary as Markdown and ``--readme PATH`` puts
it between the markers of ``bench/README.md``.

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
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from _report import (
    BOUNDS,
    CPU,
    DRIFT_LIMIT,
    Sample,
    drift,
    is_throughput,
    ratio_name,
    unit_of,
    window_yardstick,
)

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


def at_least(bound: float | Callable[[Figures], float | None], text: str) -> Target:
    return Target(True, bound, text)


def at_most(bound: float, text: str) -> Target:
    return Target(False, bound, text)


def _times(ref: Ref, factor: float) -> Callable[[Figures], float | None]:
    """A bound that is ``factor`` times another figure of the run."""

    def bound(figures: Figures) -> float | None:
        other = figures.get(ref[0], {}).get(ref[1])
        return None if other is None else factor * other

    return bound


def _times_set_1conn(factor: float) -> Callable[[Figures], float | None]:
    return _times(("kv", "set_ops_per_s_1conn"), factor)


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
    # issue 31's targets: the same Set at the other end of a bucket's growth to 10M keys
    # (bench/kv_growth.py), then servers restarted on that bucket (bench/large_bucket.py)
    # each the median of 3 segments of 100k keys (bench/kv_growth.py)
    Row("KV Set, 1 conn, first 300k of 10M keys, ops/s", ("kv_growth", "first_set_ops_per_s")),
    Row("KV Set, 1 conn, last 300k of 10M keys, ops/s", ("kv_growth", "last_set_ops_per_s"),
        at_least(_times(("kv_growth", "first_set_ops_per_s"), 0.9), ">= 0.9x first 300k")),
    Row("  disk per key at 10M keys, B", ("kv_growth", "disk_bytes_per_key")),
    Row("  server RSS at 10M keys (valueOnly), MiB", ("kv_growth", "server_rss_mib")),
    Row("warm-up of 10M items, valueOnly, s", ("large_bucket", "value_only_warmup_s"),
        at_most(30.0, "<= 30 s")),
    Row("10M items, fullEviction, 512 MiB: warm-up, s", ("large_bucket", "full_eviction_warmup_s"),
        at_most(2.0, "<= 2 s")),
    Row("  its RSS, MiB", ("large_bucket", "full_eviction_rss_mib"), at_most(1024.0, "< 1 GiB")),
    Row("  random Gets (non-resident), 1 conn, ops/s",
        ("large_bucket", "random_get_ops_per_s_1conn"), at_least(50_000, ">= 50k")),
    Row("  random Gets (non-resident), 4 conns, ops/s",
        ("large_bucket", "random_get_ops_per_s_4conn"), at_least(50_000, ">= 50k")),
    Row("  Gets of keys never written, 4 conns, ops/s",
        ("large_bucket", "missing_get_ops_per_s_4conn")),
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
    # Issue 28: the goal is for the 3-node run (bench/durability.py --nodes 3).
    Row("SyncWrite Majority p50 @16 in flight, ms", ("durability", "majority_p50_ms_16"),
        at_most(5.0, "<= 5 ms")),
    Row("  Majority p50 / polling p50 @16", ("durability", "majority_p50_vs_polling_16"),
        at_most(0.1, "<= 0.1x")),
    Row("SyncWrite PersistToMajority p50 @16 in flight, ms",
        ("durability", "persist_majority_p50_ms_16")),
    Row("client durability (polling) p50 @16 in flight, ms", ("durability", "polling_p50_ms_16")),
    Row("plain write p50 @16 in flight, ms", ("durability", "plain_p50_ms_16")),
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


RUN = "make bench"  # the yardstick timings around the whole run, beside each benchmark's own
README_BEGIN = "<!-- make bench summary: bench/summary.py --readme bench/README.md -->"
README_END = "<!-- end of the make bench summary -->"
COLUMNS = ("metric", "dcpkv / yardstick", "peer", "dcpkv / peer", "target", "met", "dcpkv",
           "peer figure", "yardstick")  # fmt: skip
# the packages named in the summary's header (machine.json lists every one)
KEY_PACKAGES = ("pyspark", "pyarrow", "uvloop", "orjson", "cramjam", "aiohttp")


@dataclass
class Run:
    """Everything one ``make bench`` left in its results folder."""

    figures: Figures
    yardsticks: dict[str, tuple[float, float]]  # bench (or RUN) -> (start, end), frames/s
    machine: dict[str, dict[str, str]]
    # (bench, metric) -> (its ratio to the yardstick, the yardstick it goes with, its bound): a
    # figure measured in its own window (bench/_report.py)
    own: dict[Ref, tuple[float, float, str]] = field(default_factory=dict)
    moved: dict[str, list[str]] = field(default_factory=dict)  # bench -> its uncertain figures
    # bench -> the probe's speed over the whole benchmark, frames/s (bench/_report.py)
    during: dict[str, float] = field(default_factory=dict)


def load(results: Path) -> Run:
    """Every figure of the run, by source (see the module docstring), and its yardsticks."""
    figures: Figures = {}
    yardsticks: dict[str, tuple[float, float]] = {}
    during: dict[str, float] = {}
    machine: dict[str, dict[str, str]] = {}
    own: dict[Ref, tuple[float, float, str]] = {}
    moved: dict[str, list[str]] = {}
    for path in sorted(results.glob("*.json")):
        body = json.loads(path.read_text())
        if path.name == "machine.json":
            machine = body
        elif "bench" in body:
            figures[body["bench"]] = body["figures"]
            if "yardstick" in body:
                yardsticks[body["bench"]] = (body["yardstick"]["start"], body["yardstick"]["end"])
                if "during" in body["yardstick"]:
                    during[body["bench"]] = body["yardstick"]["during"]
            own |= _own_yardsticks(body)
            if "moved" in body:  # (files from before per-figure windows have none)
                moved[body["bench"]] = body["moved"]
            for peer, values in body.get("peer", {}).items():
                figures[f"{body['bench']}:{peer}"] = values
        elif "peer" in body:
            figures[f"peer:{body['peer']}"] = body["median"]
    start = figures.get("yardstick_start", {}).get("frames_per_s")
    end = figures.get("yardstick_end", {}).get("frames_per_s")
    if start and end:
        yardsticks[RUN] = (start, end)
    return Run(figures, yardsticks, machine, own, moved, during)


def _own_yardsticks(body: dict[str, Any]) -> dict[Ref, tuple[float, float, str]]:
    """The windowed figures of one benchmark's JSON: their ratio, their yardstick and the
    resource they are bound by (whose yardstick it is)."""
    out = {}
    for metric, samples in body.get("windows", {}).items():
        bound = body.get("bounds", {}).get(metric, CPU)
        ratio = body["ratios"].get(ratio_name(metric, bound))
        if ratio is not None:
            yardstick = window_yardstick([Sample(*sample) for sample in samples])
            out[(body["bench"], metric)] = (ratio, yardstick, bound)
    return out


def _get(figures: Figures, ref: Ref) -> float | None:
    value = figures.get(ref[0], {}).get(ref[1])
    return None if value is None else float(value)


def fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _yardstick(run: Run, bench: str) -> float | None:
    """The yardstick a benchmark's figures go with: the probe's speed over the benchmark, else
    the higher of its own timings, else of the run's (``_report.Figures.bench_speed``)."""
    if bench in run.during:
        return run.during[bench]
    timings = run.yardsticks.get(bench) or run.yardsticks.get(RUN)
    return None if timings is None else max(timings)


def row_lines(row: Row, run: Run) -> list[list[str]]:
    """A row's table lines: one, or one per peer that ran (the first line carries the rest)."""
    value = _get(run.figures, row.figure)
    yardstick = _yardstick(run, row.figure[0])
    throughput = is_throughput(unit_of(row.figure[1]))  # a latency over frames/s means nothing
    per_yardstick = value / yardstick if throughput and value is not None and yardstick else None
    bound = CPU
    if row.figure in run.own:
        per_yardstick, yardstick, bound = run.own[row.figure]
    met = None if value is None or row.target is None else row.target.met(value, run.figures)
    peers = [(name, _get(run.figures, ref)) for name, ref in row.peers]
    peers = [(name, p) for name, p in peers if p is not None] or [("", None)]
    lines = []
    for i, (name, peer) in enumerate(peers):
        ratio = value / peer if value is not None and peer else None
        mine = [row.what, fmt(per_yardstick) if throughput else ""] if i == 0 else ["", ""]
        rest = [
            row.target.text if row.target else "",
            {True: "yes", False: "NO", None: "-" if row.target else ""}[met],
            fmt(value),
        ]
        lines.append([*mine, name, fmt(ratio) if name else "", *(rest if i == 0 else [""] * 3),
                      fmt(peer) if name else "",
                      _with_unit(yardstick, bound) if i == 0 else ""])  # fmt: skip
    return lines


def _with_unit(yardstick: float | None, bound: str) -> str:
    """A yardstick's cell: its figure and unit (a latency yardstick is not in frames/s)."""
    return "-" if yardstick is None else f"{fmt(yardstick)} {BOUNDS[bound][1]}"


def warnings(run: Run) -> list[str]:
    """One line per yardstick pair more than DRIFT_LIMIT apart, the whole run's first."""
    out = []
    for bench in sorted(run.yardsticks, key=lambda b: b != RUN):
        start, end = run.yardsticks[bench]
        if bench in run.moved:
            if not run.moved[bench]:
                continue
            out.append(
                f"WARNING: the yardstick moved over {DRIFT_LIMIT:.0%} while {bench} "
                f"measured {', '.join(run.moved[bench])}: their ratios are uncertain"
            )
        elif drift(start, end) > DRIFT_LIMIT:
            what = "the run" if bench == RUN else bench
            out.append(f"WARNING: the yardstick moved {drift(start, end):.0%} during {what} "
                       f"({start:,.0f} -> {end:,.0f} frames/s): the machine changed speed, "
                       "its ratios are uncertain")  # fmt: skip
    return out


def memory_yardsticks(run: Run) -> list[float]:
    """The run's memory yardstick at its start and end (``make bench``), where it has them."""
    timings = (run.figures.get(f"memory_yardstick_{at}", {}) for at in ("start", "end"))
    return [t["memory_steps_per_s"] for t in timings if t.get("memory_steps_per_s")]


def header(run: Run) -> list[str]:
    """The lines above the table: warnings first, then what the run ran on."""
    out = warnings(run)
    machine = run.machine.get("machine", {})
    if machine:
        out.append(f"machine: {machine['name']} (host {machine['host']}, load average at the "
                   f"start {machine['loadavg_at_start']}), {machine['python']}, dcpkv "
                   f"{machine['commit']}")  # fmt: skip
    packages = run.machine.get("packages", {})
    if packages:
        named = ", ".join(f"{n} {packages[n]}" for n in KEY_PACKAGES if n in packages)
        out.append(f"dependencies: {len(packages)} packages (machine.json), {named}")
    if run.machine.get("peers"):
        out.append("peers: " + "; ".join(f"{n} {v}" for n, v in run.machine["peers"].items()))
    if RUN in run.yardsticks:
        start, end = run.yardsticks[RUN]
        out.append(f"yardstick (bench/yardstick.py): {start:,.0f} frames/s at the start of the "
                   f"run, {end:,.0f} at its end")  # fmt: skip
    memory = memory_yardsticks(run)
    if len(memory) == 2:
        out.append(f"memory yardstick (bench/yardstick.py --kind memory): {memory[0]:,.0f} "
                   f"steps/s at the start of the run, {memory[1]:,.0f} at its end")  # fmt: skip
    return out


TITLE = "make bench: ratios to the yardstick and to the peers of the same run, then the targets"


def table(run: Run) -> Table:
    out = Table(title=TITLE)
    for col in COLUMNS:
        out.add_column(col, justify="left" if col in ("metric", "target", "peer") else "right")
    for row in ROWS:
        for line in row_lines(row, run):
            out.add_row(*line)
    return out


def markdown(run: Run) -> str:
    lines = [*(f"{line}  " for line in header(run)), "", f"| {' | '.join(COLUMNS)} |",
             "|" + "|".join("---" if c in ("metric", "target", "peer") else "---:"
                            for c in COLUMNS) + "|"]  # fmt: skip
    for row in ROWS:
        for line in row_lines(row, run):
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |")
    return "\n".join(lines) + "\n"


def replace_section(text: str, section: str) -> str:
    """``text`` with what lies between the README markers replaced by ``section``."""
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"no {README_BEGIN} ... {README_END} markers to write between")
    return text[: begin + len(README_BEGIN)] + "\n" + section + text[end:]


def main(
    results: Annotated[Path, typer.Argument(help="folder of this run's JSON files")] = Path(
        "bench/results"
    ),
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown", help="also write the summary here, as Markdown")
    ] = None,
    readme: Annotated[
        Path | None, typer.Option("--readme", help="put the Markdown between this file's markers")
    ] = None,
) -> None:
    run = load(results)
    if not run.figures:
        raise SystemExit(f"no benchmark JSON in {results}")
    console = Console(width=170)
    for line in header(run):
        console.print(line, style="bold red" if line.startswith("WARNING") else None)
    console.print(table(run))
    if markdown_out is not None:
        markdown_out.write_text(markdown(run))
    if readme is not None:
        readme.write_text(replace_section(readme.read_text(), markdown(run)))


if __name__ == "__main__":
    typer.run(main)

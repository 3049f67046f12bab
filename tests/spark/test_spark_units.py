"""The pure parts of dcpkv.spark: offsets, planning, options, rows, the sink's row mapping."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import Row

from dcpkv.client.durability import Durability, ServerDurability
from dcpkv.client.offsets import VbucketOffset
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.seqno import U64_MAX
from dcpkv.spark.options import OptionError, parse_options, parse_vbuckets
from dcpkv.spark.plan import plan_end, split_budget, spread, spread_by_node, targets
from dcpkv.spark.rows import (
    ARROW_SCHEMA,
    RowRangeError,
    event_batches,
    event_row,
    rollback_row,
    to_batch,
)
from dcpkv.spark.source import SinkError, row_op
from dcpkv.spark.sparkoffsets import SparkOffsetError, SparkOffsets, VbPosition

A, B = 0xAAAA, 0xBBBB


def test_offsets_keep_u64_exact_through_json_with_a_fixed_order() -> None:
    offsets = SparkOffsets(
        {
            10: VbPosition(VbucketOffset(U64_MAX, U64_MAX - 1, U64_MAX - 2, U64_MAX)),
            2: VbPosition.at(5, A, [1, 3]),
        }
    )
    text = json.dumps(offsets.to_dict())
    assert SparkOffsets.from_dict(json.loads(text)) == offsets
    assert list(json.loads(text)["vbuckets"]) == ["2", "10"]  # numeric, not string, order
    vb10 = json.loads(text)["vbuckets"]["10"]
    assert list(vb10) == ["vb_uuid", "seqno", "snap_start", "snap_end", "points"]
    assert vb10["vb_uuid"] == "18446744073709551615"
    assert offsets.to_json() == SparkOffsets.from_dict_json(offsets.to_json()).to_json()


def _one(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"vb_uuid": "1", "seqno": "0", "snap_start": "0", "snap_end": "0"}
    return {"format": 1, "vbuckets": {"0": {**base, **fields}}}


@pytest.mark.parametrize(
    "bad",
    [
        {"format": 2, "vbuckets": {}},
        {"format": 1, "vbuckets": {"x": {}}},
        _one(vb_uuid=1.5),
        _one(seqno="9", snap_end="5"),
        _one(seqno=str(U64_MAX + 1), snap_end=str(U64_MAX + 1)),
        _one(points=["0"]),
    ],
)
def test_bad_offsets_are_refused(bad: object) -> None:
    with pytest.raises(SparkOffsetError):
        SparkOffsets.from_dict(bad)


def test_client_offsets_carry_the_branch_ancestry_and_points() -> None:
    offsets = SparkOffsets({0: VbPosition.at(100, A, [40, 70]), 1: VbPosition.at(9, 0x77)})
    log = (FailoverEntry(B, 80), FailoverEntry(A, 0))
    client = offsets.client_offsets([0, 1], {0: log, 1: log})
    assert client.progress(0).failover_log == (FailoverEntry(A, 0),)
    assert client.progress(0).consistent_points == (40, 70, 100)
    assert client[0] == VbucketOffset.at(100, A)
    # a branch the producer never heard of: a one-entry log, the producer rolls it to 0
    assert client.progress(1).failover_log == (FailoverEntry(0x77, 0),)


def test_split_budget_is_fair_bounded_and_starves_nobody() -> None:
    distances = {0: 100, 1: 5, 2: 0, 3: 40}
    assert split_budget(distances, None) == distances
    assert split_budget(distances, 1000) == distances
    alloc = split_budget(distances, 60)
    assert sum(alloc.values()) == 60 and alloc == {0: 28, 1: 5, 2: 0, 3: 27}
    small = split_budget({0: 10, 1: 10, 2: 12}, 2)
    assert sum(small.values()) == 2 and small[2] == 1  # the one with the most left goes first


def test_plan_end_reads_to_high_seqno_and_returns_start_when_caught_up() -> None:
    start = SparkOffsets({0: VbPosition.at(10, A), 1: VbPosition.at(4, A)})
    end = plan_end(start, {0: (A, 25), 1: (A, 4)}, {}, None)
    assert end[0] == VbPosition.at(25, A, [10]) and end[1] == start[1]
    assert plan_end(end, {0: (A, 25), 1: (A, 4)}, {}, None) == end  # AvailableNow stops
    limited = plan_end(start, {0: (A, 25), 1: (A, 4)}, {}, 5)
    assert limited[0].offset.seqno == 15
    work = targets(start, end)
    assert [(t.vbucket, t.end) for t in work] == [(0, 25)]


def test_plan_end_after_a_branch_change_lands_on_a_consistent_point() -> None:
    # The consumer read to 100 on A; the server kept 80 and branched (B), then grew to 90.
    start = SparkOffsets({0: VbPosition.at(100, A, [40, 70, 95])})
    log = (FailoverEntry(B, 80), FailoverEntry(A, 0))
    end = plan_end(start, {0: (B, 90)}, {0: log}, None)
    assert end[0] == VbPosition.at(90, B, [40, 70])  # 95 and 100 lay on the lost history
    # A budget smaller than the re-stream still moves the vbucket (its rollback is news).
    assert plan_end(start, {0: (B, 90)}, {0: log}, 0)[0] == VbPosition.at(70, B, [40])
    # A branch cut exactly where the consumer stands needs no rollback and no batch.
    same = SparkOffsets({0: VbPosition.at(80, A)})
    assert plan_end(same, {0: (B, 80)}, {0: log}, None) == same


def test_spread_puts_every_vbucket_in_one_task() -> None:
    start = SparkOffsets({vb: VbPosition.at(0, 0) for vb in range(10)})
    end = SparkOffsets({vb: VbPosition.at(vb * 10 + 1, A) for vb in range(10)})
    tasks = spread(targets(start, end), 3)
    assert len(tasks) == 3
    assert sorted(t.vbucket for task in tasks for t in task) == list(range(10))
    loads = [sum(t.distance for t in task) for task in tasks]
    assert max(loads) - min(loads) <= 91  # longest-first onto the least loaded
    assert spread([], 4) == []


@pytest.mark.parametrize(
    ("distances", "tasks"),
    [
        ([5] * 1024, 1),
        ([10] * 1024, 2),
        ([9_999], 1),
        ([5_000, 5_000], 2),
        ([49_999, 1], 2),
        ([50_000, 1], 2),
        ([50_000, 50_000, 1], 3),
        ([30_000] * 10, 6),
        ([10**6] * 64, 16),
    ],
)
def test_default_tasks_follow_the_batch_size(distances: list[int], tasks: int) -> None:
    """Without numPartitions: a task per 50k changes, 1 to 16, two from 10k changes (a small
    live batch over 1024 vbuckets is one task, not sixteen connections and logins; a first
    batch of 30k changes uses both cores of a small machine)."""
    start = SparkOffsets({vb: VbPosition.at(0, 0) for vb in range(len(distances))})
    end = SparkOffsets({vb: VbPosition.at(d, A) for vb, d in enumerate(distances)})
    assert len(spread(targets(start, end), None)) == tasks


@given(
    st.dictionaries(st.integers(0, 63), st.sampled_from(["a:1", "b:2", "c:3"]), min_size=1),
    st.integers(1, 20),
)
def test_spread_by_node_never_mixes_nodes_in_a_task(node_of: dict[int, str], n: int) -> None:
    work = targets(
        SparkOffsets({vb: VbPosition.at(0, 0) for vb in node_of}),
        SparkOffsets({vb: VbPosition.at(vb + 1, A) for vb in node_of}),
    )
    tasks = spread_by_node(work, n, node_of)
    assert sorted(t.vbucket for task in tasks for t in task) == sorted(node_of)
    assert all(len({node_of[t.vbucket] for t in task}) == 1 for task in tasks)
    assert all(task for task in tasks)
    assert len(tasks) <= max(n, len(set(node_of.values()))) + len(set(node_of.values()))
    # one node (a single server): exactly the plain spread
    assert spread_by_node(work, n, {vb: "a:1" for vb in node_of}) == spread(work, n)


def test_options() -> None:
    assert parse_vbuckets("0,1,5-9") == (0, 1, 5, 6, 7, 8, 9)
    assert parse_vbuckets("") == ()
    opts = parse_options(
        {"nodes": "10.0.0.1:12000,other:1", "maxChangesPerTrigger": "7", "includeValues": "false"}
    )
    assert (opts.host, opts.port, opts.max_changes_per_trigger) == ("10.0.0.1", 12000, 7)
    assert opts.include_values is False and opts.starting == "earliest"
    given = SparkOffsets({3: VbPosition.at(5, A)})
    assert parse_options({"startingOffsets": given.to_json()}).starting == given
    assert opts.durability is None and parse_options({"durability": "none"}).durability is None
    durable = parse_options({"durability": "persistToMajority", "durabilityTimeoutMs": "5000"})
    assert durable.durability == ServerDurability(Durability.PERSIST_TO_MAJORITY, 5.0)
    bads = [{"vbuckets": "3-1"}, {"port": "x"}, {"maxChangesPerTrigger": "0"}]
    bads += [{"startingOffsets": "{"}, {"mode": "rows"}, {"includeValues": "maybe"}]
    bads += [{"durability": "all"}, {"durability": "majority", "durabilityTimeoutMs": "70000"}]
    for bad in bads:
        with pytest.raises(OptionError):
            parse_options(bad)


S64_MAX = 2**63 - 1


def _signed(value: int) -> int:
    """A u64 as its 64 bits read as a signed number (the BIGINT of cas and vb_uuid)."""
    return value - 2**64 if value > S64_MAX else value


def test_seqnos_are_bigint_and_one_beyond_is_a_clear_error() -> None:
    batch = to_batch([rollback_row(3, S64_MAX)])
    assert batch.schema == ARROW_SCHEMA
    assert batch.column("seqno")[0].as_py() == S64_MAX
    assert batch.column("key")[0].as_py() is None
    with pytest.raises(RowRangeError, match=f"vbucket 5: seqno {2**63} is beyond 2\\^63-1"):
        to_batch([rollback_row(3, 7), rollback_row(5, 2**63)])
    from dcpkv.client import events

    o = VbucketOffset(1, 9, 9, U64_MAX)
    mutation = events.Mutation(6, b"k", b"v", 9, 1, 0, 0, 1, 0, o)
    with pytest.raises(RowRangeError, match=f"vbucket 6: snap_end {U64_MAX} "):
        list(event_batches(iter([mutation]), True))


def test_cas_and_vb_uuid_keep_the_u64_bits() -> None:
    """cas and vb_uuid are the u64's bits: from 2**63 up negative, and back exactly."""
    from dcpkv.client import events

    cases = [0, 1, S64_MAX, 2**63, U64_MAX]
    evs = [
        events.Mutation(0, b"k%d" % i, b"", i + 1, 1, 0, 0, c, 0, VbucketOffset(c, i + 1, 0, 9))
        for i, c in enumerate(cases)
    ]
    (batch,) = event_batches(iter(evs), True)
    for name in ("cas", "vb_uuid"):
        got = batch.column(name).to_pylist()
        assert got == [_signed(c) for c in cases]
        assert [g % 2**64 for g in got] == cases


def _events(kinds: str) -> list[Any]:
    from dcpkv.client import events

    out: list[Any] = []
    for i, kind in enumerate(kinds):
        o = VbucketOffset(U64_MAX - i, 10 + i, 10, 10 + len(kinds))
        if kind == "m":
            out.append(
                events.Mutation(
                    i % 3, b"k%d" % i, b"v" * i, 10 + i, 1, 2**32 - 1, 7, U64_MAX - i, 1, o
                )
            )
        elif kind == "d":
            out.append(events.Deletion(1, b"d%d" % i, 10 + i, 2, 2**63, o, 5))
        elif kind == "e":
            out.append(events.Expiration(2, b"e%d" % i, 10 + i, 3, 9, o))
        elif kind == "r":
            out.append(events.Rollback(1, 4, 6, o, VbucketOffset.at(4, 1)))
        else:
            out.append(events.SnapshotStart(1, 10, 20, 0, o))
    return out


@pytest.mark.parametrize("kinds", ["mmmmm", "mdmem", "rmms", "s", "mmmmmmm"])
@pytest.mark.parametrize("values", [True, False])
def test_batches_from_events_hold_what_row_tuples_held(kinds: str, values: bool) -> None:
    """Columns built straight from the events (mutations only) or through rows (mixed) are
    the very rows :func:`event_row` describes, u64s exact, cut every ``batch_rows``."""
    evs = _events(kinds)
    got = list(event_batches(iter(evs), values, batch_rows=3))
    rows = [r for r in (event_row(e, values) for e in evs) if r is not None]
    assert [b.num_rows for b in got] == [min(3, len(rows) - i) for i in range(0, len(rows), 3)]
    assert all(b.schema == ARROW_SCHEMA for b in got)
    if rows:
        assert pa.Table.from_batches(got).equals(pa.Table.from_batches([to_batch(rows)]))
        table = pa.Table.from_batches(got).to_pylist()
        assert [tuple(r.values()) for r in table] == [
            tuple(_signed(v) if i in (7, 10) and v is not None else v
                  for i, v in enumerate(r)) for r in rows
        ]  # fmt: skip


def test_sink_row_mapping() -> None:
    cols = ("key", "value", "op")
    assert row_op(Row(key="k", value=b"v", op=None), cols).value == b"v"
    assert row_op(Row(key=b"k", value=None, op="deletion"), cols).delete
    assert row_op(Row(key=b"k", value=None, op="rollback"), cols) is None
    with pytest.raises(SinkError, match="without a key"):
        row_op(Row(key=None, value=b"v", op="mutation"), cols)


def test_the_driver_link_is_pickled_without_its_connection() -> None:
    """The stream reader goes to the tasks pickled: its kept planning connection (a
    SyncConsumer with a thread) must stay behind."""
    import pickle
    import threading

    from dcpkv.spark.source import DcpkvStreamReader

    reader = DcpkvStreamReader(parse_options({"port": "1"}))
    reader._link._consumer = threading.Lock()  # type: ignore[assignment]  # unpicklable
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._link._consumer is None and copy._link.opts == reader.opts
    assert reader._link._consumer is not None

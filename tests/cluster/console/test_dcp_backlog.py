"""The console's DCP panel: a node's ``stat dcp`` rows made into connections and backlogs."""

from __future__ import annotations

import pytest

from dcpkv.cluster.console.dcp_backlog import connection_type, parse

END = str(2**64 - 1)


def producer(name: str, streams: dict[str, dict[str, object]], **own: object) -> list[tuple]:
    rows: list[tuple[str, str]] = [(f"type:{name}", "producer")]
    rows += [(f"{k}:{name}", str(v)) for k, v in own.items()]
    for where, stats in streams.items():
        rows += [(f"{k}:{where}:{name}", str(v)) for k, v in stats.items()]
    return rows


def stream(state: str, last_sent: int, end: str = END) -> dict[str, object]:
    return {"state": state, "start_seqno": 0, "end_seqno": end, "last_sent_seqno": last_sent}


TOTALS = [("ep_dcp_count", "2"), ("ep_dcp_items_sent", "9")]


def test_rows_go_to_the_connection_whose_type_row_came_last_even_with_colons_in_names() -> None:
    rows = [
        *TOTALS,
        *producer("Replica:127.0.0.1:11210", {"0": stream("in_memory", 5)}, items_sent=5),
        *producer("dcpkv-spark:12:ab", {"1:sid3": stream("backfilling", 2)}, items_sent=2),
        ("items_received:Replica:127.0.0.1:11211", "7"),  # this node's own consumer: not ours
    ]
    first, second = parse(rows)
    assert (first.name, first.stats, list(first.streams)) == (
        "Replica:127.0.0.1:11210",
        {"items_sent": "5"},
        ["0"],
    )
    assert (second.name, list(second.streams)) == ("dcpkv-spark:12:ab", ["1:sid3"])
    assert second.streams["1:sid3"]["state"] == "backfilling"
    assert "items_received" not in second.stats


def test_no_producer_no_connection() -> None:
    assert parse(TOTALS) == []


@pytest.mark.parametrize(
    ("state", "last_sent", "end", "high", "backlog"),
    [
        ("in_memory", 5, END, 12, 7),  # behind the high seqno
        ("in_memory", 12, END, 12, 0),  # caught up
        ("backfilling", 0, END, 40, 40),
        ("in_memory", 5, "8", 12, 3),  # a bounded stream ends at its end seqno
        ("in_memory", 9, "8", 12, 0),  # never below 0
        ("dead", 5, END, 12, 0),  # a dead stream sends nothing more
        ("in_memory", 5, END, None, 0),  # the vbucket is not held here (no high seqno)
    ],
)
def test_backlog_per_stream(
    state: str, last_sent: int, end: str, high: int | None, backlog: int
) -> None:
    (conn,) = parse(producer("c", {"4": stream(state, last_sent, end)}))
    highs = {} if high is None else {4: high}
    assert conn.backlog(highs) == backlog


def test_summary_counts_live_streams_and_sums_the_backlog() -> None:
    streams = {
        "0": stream("in_memory", 3),
        "1": stream("backfilling", 0),
        "2": stream("dead", 0),
        "3:sid1": stream("in_memory", 1),
    }
    rows = producer("Replica:n1", streams, items_sent=4, total_bytes_sent=400, unacked_bytes=9)
    (conn,) = parse(rows)
    assert conn.summary({0: 10, 1: 5, 2: 50, 3: 1}) == {
        "name": "Replica:n1",
        "type": "replication",
        "streams": 3,
        "backfilling": 1,
        "itemsSent": 4,
        "bytesSent": 400,
        "unackedBytes": 9,
        "backlog": 7 + 5 + 0 + 0,
    }


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("Replica:127.0.0.1:11210", "replication"),
        ("replication:a->b", "replication"),
        ("dcpkv-spark:1:2", "spark"),
        ("xdcr:remote", "xdcr"),
        ("my-consumer", "other"),
    ],
)
def test_connection_types(name: str, kind: str) -> None:
    assert connection_type(name) == kind


def test_an_unreadable_figure_counts_as_nothing() -> None:
    (conn,) = parse(producer("c", {"0": stream("in_memory", 0)}, items_sent="n/a"))
    assert conn.summary({0: 1})["itemsSent"] == 0

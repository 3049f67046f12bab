"""DCP connections and their backlog, read from a node's ``stat dcp`` rows (the console's panel).

Theory of operation
-------------------
A node answers ``stat dcp`` with bucket totals, then for each producer connection a
``type:NAME`` row (``producer``) followed by its own rows in spec 002's naming: ``stat:NAME``
for the connection and ``stat:VB:NAME`` (``stat:VB:sidN:NAME`` on a stream-ID connection) for
each stream; a node's own replica consumers' rows come last. A name may itself hold colons
(``Replica:127.0.0.1:11210``), so a row belongs to the connection whose ``type:`` row came
last only when it ends with ``:NAME``; what is left before it is the stat, with the stream's
vbucket in between when there is one.

A connection's *backlog* is what its live streams still have to send, in items:

=================================  =============================================
the stream                         items remaining
=================================  =============================================
dead                               0 (it sends nothing more)
its vbucket not held (not in the   0 (nothing there to send)
node's high seqnos)
otherwise                          ``min(end_seqno, high) - last_sent_seqno``,
                                   never below 0
=================================  =============================================

(``high`` is the vbucket's high seqno on that node, GetAllVbSeqnos; seqnos count mutations,
so deduplicated or already-sent changes may make this an upper bound, never an undercount.)

The connection type is the reference's ``connection_type`` label, by name prefix:
``replication`` (a replica's stream from its active), ``spark`` (the Spark source),
``xdcr`` (a cross data centre replicator), ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dcpkv.cluster.console.sampling import as_count

CONNECTION_TYPES = (
    ("Replica:", "replication"),
    ("replication:", "replication"),
    ("dcpkv-spark:", "spark"),
    ("xdcr:", "xdcr"),
)


# a stream's rows the console reads (a stream has a dozen; 1,024 vbuckets make thousands)
STREAM_STATS = frozenset({"state", "end_seqno", "last_sent_seqno"})


def connection_type(name: str) -> str:
    for prefix, kind in CONNECTION_TYPES:
        if name.startswith(prefix):
            return kind
    return "other"


@dataclass
class DcpConnection:
    """One producer connection of one node, as its stats tell it."""

    name: str
    stats: dict[str, str] = field(default_factory=dict)  # the connection's own rows
    streams: dict[str, dict[str, str]] = field(default_factory=dict)  # "VB[:sidN]" -> rows

    def backlog(self, high_seqnos: dict[int, int]) -> int:
        """Items its live streams still have to send (the table in the module docstring)."""
        return sum(_remaining(where, rows, high_seqnos) for where, rows in self.streams.items())

    def summary(self, high_seqnos: dict[int, int]) -> dict[str, Any]:
        live = [r for r in self.streams.values() if r.get("state", "dead") != "dead"]
        return {
            "name": self.name,
            "type": connection_type(self.name),
            "streams": len(live),
            "backfilling": sum(1 for r in live if r.get("state") == "backfilling"),
            "itemsSent": as_count(self.stats.get("items_sent")),
            "bytesSent": as_count(self.stats.get("total_bytes_sent")),
            "unackedBytes": as_count(self.stats.get("unacked_bytes")),
            "backlog": self.backlog(high_seqnos),
        }


def parse(rows: Iterable[tuple[str, str]]) -> list[DcpConnection]:
    """The producer connections in ``stat dcp`` rows, in the order the node lists them; of
    each stream, only what its backlog and state need (``STREAM_STATS``)."""
    connections: list[DcpConnection] = []
    current: DcpConnection | None = None
    suffix = ""
    for key, value in rows:
        if value == "producer" and key.startswith("type:"):
            current = DcpConnection(key[5:])
            connections.append(current)
            suffix = f":{current.name}"
        elif current is not None and key.endswith(suffix):
            stat, _, where = key[: -len(suffix)].partition(":")
            if not where:
                current.stats[stat] = value
            elif stat in STREAM_STATS:
                current.streams.setdefault(where, {})[stat] = value
        else:
            current = None  # totals before the first, a consumer's rows after the last
    return connections


def _remaining(where: str, rows: dict[str, str], high_seqnos: dict[int, int]) -> int:
    if rows.get("state", "dead") == "dead":
        return 0
    vbucket = where.partition(":")[0]
    high = high_seqnos.get(int(vbucket)) if vbucket.isdigit() else None
    if high is None:
        return 0
    end = as_count(rows.get("end_seqno"))
    return max(0, min(end, high) - as_count(rows.get("last_sent_seqno")))

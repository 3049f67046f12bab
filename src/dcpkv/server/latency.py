"""How long the server takes to answer what it reads: a fixed-bucket histogram, cheap to fill.

Theory of operation
-------------------
The shell times each read from a connection (every whole request in it answered, the answers
queued for writing) and hands the nanoseconds to :meth:`LatencyHistogram.observe`: one
``bisect`` and two integer additions, no allocation, so timing costs a read about as much as
one more attribute lookup. A client that sends one request at a time gets one observation per
request; a pipelining client one per batch it sends. The buckets are the Prometheus ones
(``le``: at or below the bound), in seconds from 10 us to 1 s; :meth:`cumulative` gives them
as a Prometheus histogram wants them.
"""

from __future__ import annotations

from bisect import bisect_left

# Upper bounds, seconds: from the fast path's microseconds to a stalled loop's second.
BOUNDS_S = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


class LatencyHistogram:
    """Counts of observations per bucket (the last: above every bound) and their sum."""

    __slots__ = ("_bounds_ns", "counts", "total_ns")

    def __init__(self) -> None:
        self._bounds_ns = [round(b * 1e9) for b in BOUNDS_S]
        self.counts = [0] * (len(BOUNDS_S) + 1)
        self.total_ns = 0

    def observe(self, ns: int) -> None:
        self.counts[bisect_left(self._bounds_ns, ns)] += 1
        self.total_ns += ns

    def cumulative(self) -> tuple[list[tuple[str, int]], float]:
        """(``le`` label, observations at or below it) for every bound and ``+Inf``, and the
        sum in seconds: a Prometheus histogram's buckets."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip((*map(str, BOUNDS_S), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out, self.total_ns / 1e9

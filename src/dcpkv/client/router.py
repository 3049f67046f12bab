"""Which node to ask about a vbucket: the client's copy of the cluster map. No I/O.

Theory of operation
-------------------
A :class:`Router` starts from the *seeds* of a connection string and learns the cluster map
(:class:`~dcpkv.core.cluster_map.ClusterMap`) from whatever node answers: GetClusterConfig at
bootstrap and after a failure, the body of a NotMyVbucket answer. :meth:`Router.offer` keeps a
map only when its version ``(revEpoch, rev)`` is higher than the one held, so a late answer
from a node that has not heard of a change yet never takes routing back in time.

Routing: :meth:`Router.active` is the node holding a vbucket active, or None while the map
says nobody does (mid-failover): the caller waits, refreshes and asks again.
:meth:`Router.candidates` is where to ask for a fresh map: the map's nodes first (they are
the cluster now), then the seeds the map does not name (the cluster may have moved away from
all of them, or the map may be the seed's own view).

Before any map (a server too old to serve one, or none reached yet) every vbucket routes to
the first seed: a single plain node is the whole cluster, as it always was.

The retry schedule of a request (:class:`RetrySchedule`) is here too: bounded, capped
exponential backoff with jitter, against a deadline, so a request rides through a failover
(the manager's auto-failover timeout plus a map refresh) but not forever.
"""

from __future__ import annotations

import functools
import random

from dcpkv.client.settings import Node, NodeAddressError, parse_nodes
from dcpkv.core.cluster_map import ClusterMap, ClusterMapError

FIRST_RETRY = 0.05  # seconds before the second attempt of a request; doubles per attempt


@functools.lru_cache(maxsize=1024)
def node_of(server: str) -> Node:
    """A map's ``host:port`` as a :class:`Node` (cached: asked per vbucket, 1024 times per
    planning question or stream session, of the same few strings)."""
    return parse_nodes(server)[0]


class Router:
    """The seeds and the newest cluster map seen; see the module docstring."""

    __slots__ = ("map", "seeds", "tls")

    def __init__(self, seeds: tuple[Node, ...], *, tls: bool = False) -> None:
        if not seeds:
            raise NodeAddressError("a client needs at least one node to start from")
        self.seeds = seeds
        self.tls = tls  # route to the nodes' TLS ports (the map's kvSSL)
        self.map: ClusterMap | None = None

    def offer(self, raw: bytes, served_by: Node | None = None) -> bool:
        """Keep the map in ``raw`` if it is newer than the one held; whether it was. A body
        that is no map (an old server's NotMyVbucket text) changes nothing."""
        if not raw:
            return False
        try:
            new = ClusterMap.parse(
                raw, served_by=None if served_by is None else str(served_by), tls=self.tls
            )
        except ClusterMapError:
            return False
        if not new.newer_than(self.map):
            return False
        self.map = new
        return True

    @property
    def version(self) -> tuple[int, int] | None:
        return None if self.map is None else self.map.version

    def active(self, vbucket: int) -> Node | None:
        if self.map is None:
            return self.seeds[0]
        server = self.map.active(vbucket)
        return None if server is None else node_of(server)

    def replicas(self, vbucket: int) -> list[Node]:
        return [] if self.map is None else [node_of(s) for s in self.map.replicas(vbucket)]

    def nodes(self) -> list[Node]:
        """The nodes of the map (the first seed before there is one)."""
        return [node_of(s) for s in self.map.servers] if self.map else [self.seeds[0]]

    def actives_by_node(self, vbuckets: list[int] | None = None) -> dict[Node, list[int]]:
        """node -> the vbuckets (of ``vbuckets``, default all) it holds active; vbuckets
        nobody holds are left out."""
        out: dict[Node, list[int]] = {}
        wanted = range(self.map.num_vbuckets if self.map else 0) if vbuckets is None else vbuckets
        for vb in wanted:
            node = self.active(vb)
            if node is not None:
                out.setdefault(node, []).append(vb)
        return out

    def candidates(self) -> list[Node]:
        """Where to ask for a fresh map: the map's nodes, then the other seeds."""
        known = [node_of(s) for s in self.map.servers] if self.map else []
        return known + [s for s in self.seeds if s not in known]


class RetrySchedule:
    """Delays between the attempts of one request, until ``deadline`` (module docstring)."""

    __slots__ = ("attempt", "cap", "deadline", "rng")

    def __init__(
        self, now: float, budget: float, cap: float, rng: random.Random | None = None
    ) -> None:
        self.deadline = now + budget
        self.cap = cap
        self.rng = rng if rng is not None else random.Random()
        self.attempt = 0

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before the next attempt, or None: the deadline has passed."""
        if now >= self.deadline:
            return None
        step = min(self.cap, FIRST_RETRY * 2**self.attempt)
        self.attempt += 1
        return min(self.deadline - now, step * (0.5 + 0.5 * self.rng.random()))

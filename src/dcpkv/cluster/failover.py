"""The failover decision: which replica takes over each vbucket a failed node held active.

Theory of operation
-------------------
Pure: given the current map, the node to fail over, and the seqnos each surviving replica
reported (:class:`ReplicaSeqnos`), :func:`plan_failover` returns the next map and the
promotions (vbucket -> the server to turn active), or refuses with :class:`FailoverRefused` and
a message an operator can act on. For every vbucket the failed node held active, the replica
that is furthest ahead becomes the active, in one state change (spec 002, "How ns_server
performs failover"), compared as the reference's manager does (PROTOCOL.md, "SyncWrites"):

==== ============================================ ============================================
rule reported by the replicas                     promoted
==== ============================================ ============================================
F1   different high prepared seqnos               the highest: it holds every prepare a
                                                  SyncWrite acknowledged Success may still
                                                  need (a majority acked it, so at least one
                                                  surviving replica did)
F2   equal HPS, different high seqnos             the highest high seqno: the most history
F3   equal HPS and high seqno                     the highest persisted seqno (a write a
                                                  client saw persisted with ObserveSeqno)
F4   all equal                                    the earlier replica in the chain (the one
                                                  clients already try first)
F5   a replica that did not answer                not a candidate
==== ============================================ ============================================

The failed node leaves every
chain and the server list, so the map names no node clients cannot reach; the chains are
re-indexed, their tails padded with -1 (a replica to rebuild: rebalance's job, later). The
new map's rev is one higher.

Refused: failing over the last node (nothing would be left to serve), and a node holding
active some vbucket without a replica that could take it over (failover would lose it; the
operator must bring the node back instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from dcpkv.cluster.vbucket_map import NOBODY, VBucketMap
from dcpkv.core.errors import DcpkvError


class FailoverRefused(DcpkvError, ValueError):
    """Failing this node over would lose data or leave no node: nothing was changed."""


class ReplicaSeqnos(NamedTuple):
    """What a replica reports for one vbucket, in the order a failover compares them (the
    module docstring's table: a plain tuple comparison)."""

    high_prepared_seqno: int
    high_seqno: int
    persisted_seqno: int


@dataclass(frozen=True, slots=True)
class FailoverPlan:
    new_map: VBucketMap
    promotions: dict[int, str]  # vbucket -> the server whose replica becomes active


def vbuckets_to_promote(current: VBucketMap, failed: str) -> dict[int, list[str]]:
    """vbucket -> its replica servers, for every vbucket ``failed`` holds active: the
    replicas whose seqnos the decision needs."""
    if failed not in current.servers:
        return {}
    index = current.servers.index(failed)
    return {
        vb: [current.servers[i] for i in chain[1:] if i != NOBODY]
        for vb, chain in enumerate(current.chains)
        if chain[0] == index
    }


def plan_failover(
    current: VBucketMap,
    failed: str,
    reported: Mapping[int, Mapping[str, ReplicaSeqnos]],
) -> FailoverPlan:
    """See the module docstring. ``reported[vb][server]`` is what a replica reported; a
    replica missing from it (unreachable) is not a candidate."""
    if failed not in current.servers:
        raise FailoverRefused(f"{failed} is not in the vbucket map")
    if len(current.servers) < 2:
        raise FailoverRefused(f"{failed} is the last node of the map: nothing would serve")
    promotions: dict[int, str] = {}
    for vb, replicas in vbuckets_to_promote(current, failed).items():
        seqnos = reported.get(vb, {})
        candidates = [s for s in replicas if s in seqnos]
        if not candidates:
            why = "no replica" if not replicas else "no reachable replica"
            raise FailoverRefused(
                f"vbucket {vb} is active on {failed} and has {why}: failing over would lose it"
            )
        # max() keeps the first of equals: chain order breaks ties
        promotions[vb] = max(candidates, key=lambda s: seqnos[s])
    servers = [s for s in current.servers if s != failed]
    chains = [
        _next_chain(current, chain, promotions.get(vb), failed, servers)
        for vb, chain in enumerate(current.chains)
    ]
    return FailoverPlan(current.with_chains(servers, chains), promotions)


def _next_chain(
    current: VBucketMap,
    chain: tuple[int, ...],
    promoted: str | None,
    failed: str,
    servers: list[str],
) -> list[int]:
    names = [current.servers[i] for i in chain if i != NOBODY]
    if promoted is not None:
        names = [promoted, *(n for n in names if n not in (promoted, failed))]
    else:
        names = [n for n in names if n != failed]
        if chain[0] == NOBODY:  # a vbucket nobody held active stays so
            names = [None, *names]  # type: ignore[list-item]
    indexes = [NOBODY if n is None else servers.index(n) for n in names]
    return indexes + [NOBODY] * (len(chain) - len(indexes))

"""Which replication topologies the manager sends a node (PROTOCOL.md, "SyncWrites": Topology).

Theory of operation
-------------------
A SyncWrite commits once a majority of its vbucket's chain acknowledged it, so an active
vbucket must know its chain: the manager sets it with SetVbucket (state active, value
``{"topology": [[active, replica1, ...]]}``), node names as the map's ``serverList`` gives
them, ``null`` for a replica slot with no node. A vbucket active without one refuses durable
writes (DurabilityImpossible), so the manager sets it whenever the map changes (bucket
creation, failover, recovery, each rebalance move) and whenever a node may have lost it (a
restarted node holds none).

Pure: :func:`wanted` is the topology of every vbucket the map gives a node active (with a
takeover's second chain where one is in its last stage); :func:`to_send` compares it with what
the node reports it holds (``stat vbucket-topology``) and keeps the differences. Asking the
node, rather than remembering what was sent, makes a restart, a vbucket that stepped down and
came back, or a manager restart all the same case: the node says what it holds.

==== ========================================= ===========================================
case the vbucket on this node                  sent
==== ========================================= ===========================================
T1   active in the map, holds no topology      its chain
T2   holds the same chains                     nothing
T3   holds other chains (the map changed)      its chain
T4   a takeover's last stage (``second``)      its chain, then the new chain
T5   not active in the map, or nobody active   nothing (a topology is for an active only)
T6   in ``skip`` (a rebalance move drives it)  nothing
==== ========================================= ===========================================
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence

from dcpkv.cluster.vbucket_map import NOBODY, VBucketMap
from dcpkv.core.replication_topology import Slot, topology_value

Chains = tuple[tuple[Slot, ...], ...]


def chain_names(vb_map: VBucketMap, vb: int) -> tuple[Slot, ...]:
    """The vbucket's chain as node names, ``None`` for an empty slot."""
    return tuple(None if i == NOBODY else vb_map.servers[i] for i in vb_map.chains[vb])


def wanted(
    vb_map: VBucketMap,
    node: str,
    *,
    second: Mapping[int, Sequence[Slot]] | None = None,
    skip: Collection[int] = (),
) -> dict[int, Chains]:
    """vbucket -> the chains ``node`` must hold, for every vbucket the map gives it active
    (T1-T6)."""
    if node not in vb_map.servers:
        return {}
    index = vb_map.servers.index(node)
    out: dict[int, Chains] = {}
    for vb, chain in enumerate(vb_map.chains):
        if chain[0] != index or vb in skip:
            continue
        first = chain_names(vb_map, vb)
        extra = None if second is None else second.get(vb)
        out[vb] = (first,) if extra is None else (first, tuple(extra))
    return out


def held_chains(value: str) -> Chains | None:
    """The chains of a topology a node reports (its JSON value; empty: none)."""
    if not value:
        return None
    doc = json.loads(value)
    return tuple(tuple(chain) for chain in doc["topology"])


def by_active(chains: Mapping[int, Chains]) -> dict[str, dict[int, bytes]]:
    """node -> vbucket -> SetVbucket value, each vbucket's topology to its first chain's
    active (a rebalance sets them as its moves go: T3, T4; a chain with nobody active: T5)."""
    out: dict[str, dict[int, bytes]] = {}
    for vb, topology in chains.items():
        active = topology[0][0]
        if active is not None:
            out.setdefault(active, {})[vb] = topology_value(*topology)
    return out


def to_send(want: Mapping[int, Chains], held: Mapping[int, Chains | None]) -> dict[int, bytes]:
    """vbucket -> the SetVbucket value to send: the wanted topologies the node does not hold."""
    return {vb: topology_value(*chains) for vb, chains in want.items() if held.get(vb) != chains}

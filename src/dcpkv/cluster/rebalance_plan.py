"""The rebalance planner: the next vbucket map for a new node set, moving as little as it can.

Theory of operation
-------------------
Pure, like :func:`~dcpkv.cluster.vbucket_map.plan_initial`, but it starts from the current
map. Chains are by server *name* here (``None``: nobody), so nodes that join, leave or were
failed over line up between the old map and the new one.

Actives first. Each node's quota is ``V // N`` or one more; the ``V % N`` larger quotas go to
the nodes that hold the most actives already, so as few as possible must move. A vbucket keeps
its active when that node stays and is within its quota (nodes over their quota give up their
surplus, preferring vbuckets whose chain has a node still short of actives: promoting a copy
that is already there moves no data). The freed vbuckets go to the nodes short of their quota,
again preferring a node that already holds a copy. So the number of actives that change is the
lower bound: the orphans (their node left) plus each node's surplus.

Replicas next, with the same quotas over ``R * V`` copies. A vbucket keeps a replica on a node
that held any copy of it before (its old active included: that node has the data) (or, for a
delta-recovered node, holds its data outside the map: ``holding``) unless the node left, is
the new active, or is already at its quota; the empty slots are filled by the
nodes furthest below their quota (ties: the node holding the fewest replicas of this active's
vbuckets, so a failover spreads, then the lowest index). A last pass levels the counts to within
one, moving a copy from the fullest node to the emptiest where the chain allows it.

Invariants (property-tested over random node sets): every chain is whole and distinct, never a
replica on its active's node; actives and replicas per node within one of each other; a map
that is already balanced over the same nodes comes back unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from dcpkv.cluster.vbucket_map import NOBODY, Chain, VBucketMap, check_placeable

NamedChain = tuple[str | None, ...]


def named_chains(vb_map: VBucketMap) -> list[NamedChain]:
    """The map's chains with server names instead of indexes."""
    return [
        tuple(None if i == NOBODY else vb_map.servers[i] for i in chain) for chain in vb_map.chains
    ]


def with_named_chains(vb_map: VBucketMap, chains: Mapping[int, NamedChain]) -> VBucketMap:
    """The next map (one rev up): ``vb_map`` with these vbuckets' chains (by name), a node new
    to it appended to the server list."""
    servers = list(vb_map.servers)
    rows = [list(c) for c in vb_map.chains]
    for vb, chain in sorted(chains.items()):
        for node in chain:
            if node is not None and node not in servers:
                servers.append(node)
        rows[vb] = [NOBODY if n is None else servers.index(n) for n in chain]
    return vb_map.with_chains(servers, rows)


def plan_rebalance(
    current: Sequence[NamedChain],
    nodes: Sequence[str],
    num_replicas: int,
    holding: Mapping[str, Collection[int]] | None = None,
) -> list[Chain]:
    """Chains (indexes into ``nodes``) for the vbuckets of ``current`` over ``nodes``.
    ``holding``: node -> vbuckets it holds data of outside the map (a delta-recovered node):
    preferred for a copy after the map's own, as they only need to catch up."""
    check_placeable(len(nodes), num_replicas, len(current))
    index = {name: i for i, name in enumerate(nodes)}
    old = [[index.get(n, NOBODY) if n is not None else NOBODY for n in c] for c in current]
    extra: list[list[int]] = [[] for _ in current]
    for node, vbuckets in (holding or {}).items():
        for vb in vbuckets:
            if node in index and 0 <= vb < len(current) and index[node] not in old[vb]:
                extra[vb].append(index[node])
    actives = _plan_actives([o + e for o, e in zip(old, extra, strict=True)], len(nodes))
    chains = [[a] for a in actives]
    if num_replicas:
        _plan_replicas(old, extra, chains, len(nodes), num_replicas)
    return [tuple(c) for c in chains]


def _quotas(total: int, held: list[int]) -> list[int]:
    """Per node ``total // n``, one more for the ``total % n`` nodes holding the most."""
    n = len(held)
    base, extra = divmod(total, n)
    larger = set(sorted(range(n), key=lambda i: (-held[i], i))[:extra])
    return [base + (1 if i in larger else 0) for i in range(n)]


def _plan_actives(old: list[list[int]], n: int) -> list[int]:
    held = [0] * n
    for chain in old:
        if chain[0] != NOBODY:
            held[chain[0]] += 1
    quota = _quotas(len(old), held)
    actives = [chain[0] for chain in old]
    short = {i for i in range(n) if held[i] < quota[i]}
    for node in range(n):
        surplus = held[node] - quota[node]
        if surplus <= 0:
            continue
        mine = [vb for vb, chain in enumerate(old) if chain[0] == node]
        # give up first the vbuckets a short node already holds a copy of
        mine.sort(key=lambda vb: (not any(i in short for i in old[vb][1:]), vb))
        for vb in mine[:surplus]:
            actives[vb] = NOBODY
    count = [0] * n
    for a in actives:
        if a != NOBODY:
            count[a] += 1
    for vb, a in enumerate(actives):
        if a == NOBODY:
            actives[vb] = _pick(range(n), count, quota, old[vb])
            count[actives[vb]] += 1
    return actives


def _pick(candidates: range, count: list[int], quota: list[int], had: list[int]) -> int:
    """The candidate furthest below its quota, preferring one that holds a copy already."""
    return min(
        candidates, key=lambda i: (count[i] >= quota[i], i not in had, count[i] - quota[i], i)
    )


def _plan_replicas(
    old: list[list[int]], extra: list[list[int]], chains: list[list[int]], n: int, r: int
) -> None:
    copies = r * len(chains)
    held = [0] * n
    for chain in old:
        for i in chain[1:]:
            if i != NOBODY:
                held[i] += 1
    quota = _quotas(copies, held)
    count = [0] * n
    pairs = [[0] * n for _ in range(n)]
    # keep: a node that had a copy of the vbucket (old replicas first, then the old active)
    for vb, chain in enumerate(chains):
        for i in [*old[vb][1:], old[vb][0], *extra[vb]]:
            if len(chain) <= r and i != NOBODY and i not in chain and count[i] < quota[i]:
                chain.append(i)
                count[i] += 1
                pairs[chain[0]][i] += 1
    for chain in chains:
        while len(chain) <= r:
            i = min(
                (c for c in range(n) if c not in chain),
                key=lambda c: (count[c] - quota[c], pairs[chain[0]][c], c),
            )
            chain.append(i)
            count[i] += 1
            pairs[chain[0]][i] += 1
    _level(chains, count)


def _level(chains: list[list[int]], count: list[int]) -> None:
    """Move replica copies from the fullest node to the emptiest until within one."""
    while max(count) - min(count) > 1:
        full, empty = count.index(max(count)), count.index(min(count))
        vb = next((v for v, c in enumerate(chains) if full in c[1:] and empty not in c), None)
        if vb is None:  # no chain allows the move: the counts are as even as the chains let
            return
        chain = chains[vb]
        chain[chain.index(full)] = empty
        count[full] -= 1
        count[empty] += 1


def moves(current: Sequence[NamedChain], target: Sequence[NamedChain]) -> list[int]:
    """The vbuckets whose chain changes."""
    return [vb for vb, (a, b) in enumerate(zip(current, target, strict=True)) if a != b]

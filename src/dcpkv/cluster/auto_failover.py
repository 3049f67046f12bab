"""The automatic failover decision: which unresponsive node to fail over now, or why none.

Theory of operation
-------------------
Pure: :func:`decide` reads how long each member node has not answered its heartbeats
(:meth:`~dcpkv.cluster.health.HealthWatcher.unhealthy_for`), the settings (switch, timeout and
the count of automatic failovers not yet acknowledged) and the bucket maps, and returns a
:class:`Decision`: at most one node to fail over, and for every other node past the timeout
the reason it is held. The manager's asyncio loop only feeds it and carries the decision out.

The rules are Couchbase's safety rules, checked in this order:

1. only a node unresponsive for at least the timeout is a *candidate*;
2. the switch is off: nothing (the candidates are reported, never failed over);
3. the quota: at most :data:`MAX_COUNT` automatic failovers until an operator resets the
   count (``dcpkv cluster settings --reset-auto-failover-count``). A second failure after one
   failover more often means a wider problem (a network split, a rack) than two independent
   crashes, and each failover halves the cluster's redundancy: a person must look;
4. more candidates at once than the quota allows: none of them (the same reason: several
   nodes silent together is more likely the manager's own network than the nodes);
5. never the last node, and never a node holding active a vbucket with no replica on a
   responsive node: the failover would lose that vbucket (plan_failover refuses it too; the
   decision says so first, so ``status`` shows why the node stays).

A held node is not failed over later by itself unless the reason goes away (its replicas
answer again, the count is reset, the switch is turned on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dcpkv.cluster.vbucket_map import NOBODY, VBucketMap

MAX_COUNT = 1  # automatic failovers allowed before an operator resets the count


@dataclass(frozen=True, slots=True)
class Policy:
    """The settings the decision reads (a view of :class:`~dcpkv.cluster.config.FailoverConfig`)."""

    enabled: bool
    timeout_s: float
    count: int  # automatic failovers since the last reset


@dataclass(frozen=True, slots=True)
class Decision:
    node: str | None = None  # the node to fail over now
    reason: str = ""  # why that node (or, with no node, a summary)
    held: dict[str, str] = field(default_factory=dict)  # candidate -> why it is not


def decide(down_for: Mapping[str, float], policy: Policy, maps: Sequence[VBucketMap]) -> Decision:
    """See the module docstring. ``down_for`` has one entry per member node (0 = answers)."""
    candidates = sorted(n for n, s in down_for.items() if s >= policy.timeout_s)
    if not candidates:
        return Decision(reason="every node answers")
    blocked = _blocked_by_policy(candidates, policy)
    if blocked:
        return Decision(reason=blocked, held=dict.fromkeys(candidates, blocked))
    node = candidates[0]  # the only one: the quota is 1
    unsafe = _unsafe(node, down_for, maps)
    if unsafe:
        return Decision(reason=unsafe, held={node: unsafe})
    seconds = down_for[node]
    why = f"unresponsive for {seconds:.1f} s (timeout {policy.timeout_s:g} s)"
    return Decision(node=node, reason=why)


def _blocked_by_policy(candidates: list[str], policy: Policy) -> str:
    if not policy.enabled:
        return "auto-failover is off"
    if policy.count >= MAX_COUNT:
        return (
            f"the auto-failover quota is used ({policy.count} of {MAX_COUNT}): an operator "
            "must reset the count (dcpkv cluster settings --reset-auto-failover-count)"
        )
    room = MAX_COUNT - policy.count
    if len(candidates) > room:
        return (
            f"{len(candidates)} nodes are unresponsive at once; auto-failover takes at most "
            f"{room}: fail over by hand"
        )
    return ""


def _unsafe(node: str, down_for: Mapping[str, float], maps: Sequence[VBucketMap]) -> str:
    if not any(n != node and s == 0 for n, s in down_for.items()):
        return "no other node answers: nothing would serve"
    for vb_map in maps:
        if node in vb_map.servers:
            why = _unsafe_in(vb_map, node, down_for)
            if why:
                return why
    return ""


def _unsafe_in(vb_map: VBucketMap, node: str, down_for: Mapping[str, float]) -> str:
    if len(vb_map.servers) < 2:
        return "it is the last node of the map"
    index = vb_map.servers.index(node)
    for vb, chain in enumerate(vb_map.chains):
        if chain[0] != index:
            continue
        replicas = [vb_map.servers[i] for i in chain[1:] if i != NOBODY]
        if not replicas:
            return f"vbucket {vb} is active on it and has no replica"
        if all(down_for.get(r, 0.0) > 0 for r in replicas):
            return f"vbucket {vb} is active on it and no replica of it answers"
    return ""

"""Which manager may act, and until when: leadership on an etcd lease, as plain values.

Theory of operation
-------------------
Every manager holds a lease (TTL a setting, 10 s by default) and campaigns by creating the
leader key bound to it, if absent, in one transaction. The one whose key exists leads; its
**term** is the key's create revision. etcd revisions only grow, so a later leader always has
a larger term than every earlier one, and the term needs no counter of its own. The leader
stamps every map it writes with ``revEpoch = term`` (:func:`rev_epoch_for`): a node keeps the
newest ``(revEpoch, rev)``, so a deposed leader's late map is older than anything its
successor sent, whatever its ``rev``.

A lease is kept by keep-alives; etcd counts its TTL from when it *receives* one, which is
after the manager sent it, so the manager's own deadline, counted from when it *sent* the
keep-alive that was answered, is never later than etcd's. It stops acting a margin before
that deadline (:data:`MARGIN_FRACTION` of the TTL: a command already on its way to a node
then lands before a successor can be elected).

The transitions (``now`` is a monotonic clock; ``sent`` the time the request left):

==================  ===========  ==============================================================
event               from         result
==================  ===========  ==============================================================
``won``             follower     leader of ``term``, acting until ``sent + ttl - margin``
``refreshed``       leader       the deadline moves to ``sent + ttl - margin`` (never back)
``refreshed``       follower     nothing (a keep-alive of a lease that leads nothing)
``lost``            any          follower, leader unknown (keep-alive refused, the key gone
                                 or another's, a store write fenced off, etcd unreachable)
``observed``        any          the leader seen in the store (name, term) is noted
``verdict(now)``    leader       ``act`` while ``now`` < deadline, else ``stop``: the shell
                                 stops everything at once and becomes a follower
``verdict(now)``    follower     ``follow``
==================  ===========  ==============================================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from dcpkv.cluster import config as cfg

DEFAULT_LEASE_TTL_S = 10
MIN_LEASE_TTL_S = 2  # etcd's own floor is a little above its election timeout (1 s)
MARGIN_FRACTION = 0.2


class Role(StrEnum):
    FOLLOWER = "follower"
    LEADER = "leader"


class Verdict(StrEnum):
    ACT = "act"  # the leader, within its lease
    STOP = "stop"  # was the leader, its lease may be gone: stop acting now
    FOLLOW = "follow"


def rev_epoch_for(term: int) -> int:
    """The ``revEpoch`` of every map written in ``term``."""
    return term


def stamped(config: cfg.ClusterConfig, rev_epoch: int) -> cfg.ClusterConfig:
    """``config`` with every map of an older ``revEpoch`` raised to ``rev_epoch`` (0: as it
    is, a manager without a term): the same placement and rev, newer for every node."""
    buckets = tuple(
        replace(b, map=replace(b.map, rev_epoch=rev_epoch))
        if b.map is not None and b.map.rev_epoch < rev_epoch
        else b
        for b in config.buckets
    )
    return config if buckets == config.buckets else replace(config, buckets=buckets)


@dataclass(frozen=True, slots=True)
class Leadership:
    """One manager's view; every event returns the next value."""

    ttl_s: float = DEFAULT_LEASE_TTL_S
    role: Role = Role.FOLLOWER
    term: int = 0  # this manager's term while it leads, else 0
    deadline: float = 0.0  # monotonic time it must stop acting by
    leader: str | None = None  # the leader seen in the store (None: none)
    leader_term: int = 0

    @property
    def margin_s(self) -> float:
        return self.ttl_s * MARGIN_FRACTION

    def won(self, name: str, term: int, sent: float) -> Leadership:
        return replace(
            self,
            role=Role.LEADER,
            term=term,
            deadline=sent + self.ttl_s - self.margin_s,
            leader=name,
            leader_term=term,
        )

    def refreshed(self, sent: float, ttl_s: float) -> Leadership:
        if self.role != Role.LEADER:
            return self
        return replace(self, deadline=max(self.deadline, sent + ttl_s - self.margin_s))

    def lost(self) -> Leadership:
        """A follower that does not know who leads (until it reads the store again)."""
        return replace(self, role=Role.FOLLOWER, term=0, deadline=0.0, leader=None, leader_term=0)

    def observed(self, leader: str | None, term: int) -> Leadership:
        return replace(self, leader=leader, leader_term=term)

    def verdict(self, now: float) -> Verdict:
        if self.role != Role.LEADER:
            return Verdict.FOLLOW
        return Verdict.ACT if now < self.deadline else Verdict.STOP

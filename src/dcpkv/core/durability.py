"""Client durability (spec 002, "How front end clients ensure mutations are replicated or
persisted"): has a write reached enough nodes, and could a failover have lost it?

Theory of operation
-------------------
A write answers with its :class:`MutationToken` (the vbucket, the uuid of the branch it was
written on, its seqno). The client then polls ObserveSeqno on the vbucket's active and
replicas, sending the token's uuid; each answer is an :class:`Observation`. :func:`judge`
decides, without I/O:

========================================================  =======================================
observations                                              verdict
========================================================  =======================================
a node no longer knows the token's uuid (KeyEnoent)        LOST: history moved past it
a node failed over since the uuid, branch ended below      LOST: the new branch began before the
the token's seqno (``branch_end < seqno``)                 write; the client "will need to
                                                           reexamine the server's version"
>= ``persist_to`` nodes persisted through the seqno and    MET
>= ``replicate_to`` replicas hold it (received, current)
otherwise                                                  PENDING: poll again
========================================================  =======================================

A node that failed over *after* the write (its old branch ended at or above the seqno) still
holds the write, so its counts stand. ``persist_to`` counts the active too (as the SDKs'
PersistTo does); ``replicate_to`` counts replicas only. :func:`check_possible` refuses a
requirement the map cannot meet (more replicas than the bucket has) before any polling.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from dcpkv.core.errors import DcpkvError

MAX_REPLICAS = 3


class DurabilityError(DcpkvError):
    """A durability requirement was not met (the subclasses say why)."""


class DurabilityImpossibleError(DurabilityError, ValueError):
    """The requirement asks for more nodes than the vbucket has."""


class DurabilityLostError(DurabilityError):
    """A failover happened and the write may be lost: re-read the document."""


class DurabilityTimeoutError(DurabilityError, TimeoutError):
    """The requirement did not hold before the timeout (the write may still get there)."""


@dataclass(frozen=True, slots=True)
class MutationToken:
    """Where a write landed: its vbucket, the branch (vbucket uuid) and its seqno."""

    vbucket: int
    vbucket_uuid: int
    seqno: int


@dataclass(frozen=True, slots=True)
class Observation:
    """One node's ObserveSeqno answer about the token's vbucket. ``known=False``: the node's
    failover log does not hold the token's uuid. ``branch_end`` is set when the node failed
    over since that uuid: the seqno where the token's branch ended there."""

    is_active: bool
    persisted: int = 0
    current: int = 0
    known: bool = True
    branch_end: int | None = None


class Verdict(Enum):
    MET = "met"
    PENDING = "pending"
    LOST = "lost"


def check_possible(persist_to: int, replicate_to: int, replicas: int) -> None:
    """Raise :class:`DurabilityImpossibleError` when the vbucket's ``replicas`` (live chain
    members other than the active) cannot satisfy the requirement."""
    if persist_to < 0 or replicate_to < 0:
        raise DurabilityImpossibleError("persist_to and replicate_to must be >= 0")
    if replicate_to > min(replicas, MAX_REPLICAS):
        raise DurabilityImpossibleError(
            f"replicate_to={replicate_to} but the vbucket has {replicas} replica(s)"
        )
    if persist_to > 1 + min(replicas, MAX_REPLICAS):
        raise DurabilityImpossibleError(
            f"persist_to={persist_to} but the vbucket has {1 + replicas} node(s)"
        )


def judge(
    token: MutationToken,
    observations: Iterable[Observation],
    persist_to: int,
    replicate_to: int,
) -> Verdict:
    """The verdict of the table in the module docstring."""
    persisted = replicated = 0
    for obs in observations:
        if not obs.known or (obs.branch_end is not None and obs.branch_end < token.seqno):
            return Verdict.LOST
        persisted += obs.persisted >= token.seqno
        replicated += not obs.is_active and obs.current >= token.seqno
    if persisted >= persist_to and replicated >= replicate_to:
        return Verdict.MET
    return Verdict.PENDING

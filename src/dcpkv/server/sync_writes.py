"""Requests with a durability requirement (SyncWrites) on the front end: PROTOCOL.md, "SyncWrites".

Theory of operation
-------------------
The dispatcher (:mod:`dcpkv.server.dispatch`, step 3) hands a request whose framing extras
carry a durability requirement here, after its gates:

============================================ ==================================================
request                                      answer
============================================ ==================================================
a route that takes no durability             Einval
a mutation not in :data:`SYNC_WRITE_OPS`     DurabilityImpossible (Append, Prepend, Incr, Decr
                                             and sub-document mutations: not yet)
its vbucket active here without a topology   DurabilityImpossible (a standalone node, or a
(or with one that cannot reach a majority)   cluster whose manager set none)
anything else                                the handler runs as a SyncWrite
                                             (:meth:`VBucket.sync_write`): its refusals are
                                             answered at once; its write becomes a prepare,
                                             and the request is answered later
============================================ ==================================================

The later answer is a :class:`PendingAnswer`, the cookie the vbucket hands back with the
outcome: Success with the commit's CAS (and, with MutationSeqno, the commit's seqno) once the
prepare commits; SyncWriteAmbiguous when it times out or the vbucket leaves the active state.
Outcomes arrive from the loop or the flusher thread; the shell delivers them on the loop
(:func:`deliver`). Answers keep the request order: the shell holds every answer of a later
request on the connection until the pending one before it is decided (the server does not
offer UnorderedExecution).

A node's name in a topology is ``host:port`` as its config and bound port say
(:attr:`ServerState.node_name`), the name a cluster map's ``serverList`` gives it: the first
chain of a SetVbucket topology must name this node.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.item import EngineError, Item
from dcpkv.engine.vbucket import SyncOutcome, VBucket
from dcpkv.protocol import kv
from dcpkv.protocol.base import GenericResponse
from dcpkv.protocol.constants import DurabilityLevel, Opcode
from dcpkv.protocol.durability import DurabilityRequirement
from dcpkv.server.connection import Connection
from dcpkv.server.kv_handlers import active, mutated, refusal

SYNC_WRITE_OPS = frozenset(
    {
        Opcode.Set, Opcode.SetQ, Opcode.Add, Opcode.AddQ, Opcode.Replace, Opcode.ReplaceQ,
        Opcode.Delete, Opcode.DeleteQ,
    }
)  # fmt: skip

# A level as the reference's metrics label it (kv_sync_write_commit_duration_seconds{level})
LEVEL_LABELS = {
    DurabilityLevel.Majority: "majority",
    DurabilityLevel.MajorityAndPersistToActive: "majority_and_persist_on_master",
    DurabilityLevel.PersistToMajority: "persist_to_majority",
}

NOT_YET = (
    b"durability requirements are not supported for this command yet "
    b"(only Set, Add, Replace and Delete)"
)
NO_TOPOLOGY = (
    b"durability requirements are not supported on this vbucket: it has no replication "
    b"topology that can satisfy one (synchronous replication needs the cluster manager's)"
)


class PendingAnswer:
    """A SyncWrite's answer to come: its request, and the bytes once decided."""

    __slots__ = ("answer", "conn", "level", "on_ready", "req", "started", "vbucket")

    def __init__(self, conn: Connection, req: kv.Request, vbucket: VBucket, level: str) -> None:
        self.conn, self.req, self.vbucket = conn, req, vbucket
        self.level = level  # (the metric's label: LEVEL_LABELS)
        self.started = perf_counter_ns()  # (the commit's duration, a metric)
        self.answer: bytes | None = None
        # The shell's hook: an answer held behind this one may go out now.
        self.on_ready: Callable[[], None] | None = None

    def resolve(self, status: Status, item: Item | None) -> None:
        req = self.req
        if status == Status.Success and item is not None:
            answer = mutated(self.conn, req, self.vbucket, item)
            self.answer = b"" if answer is None else answer.encode()
        else:
            self.answer = GenericResponse(
                opcode=req.opcode, opaque=req.opaque, status=status
            ).encode()
        if self.on_ready is not None:
            self.on_ready()


def usable_topology(conn: Connection, vb: int) -> bool:
    """Whether a SyncWrite to ``vb`` may be tried (a vbucket that is not active here is left
    to the handler, which answers NotMyVbucket)."""
    vbucket = conn.bucket.vbuckets.get(vb) if conn.bucket is not None else None
    if vbucket is None or vbucket.state != VBucketState.ACTIVE:
        return True
    monitor = vbucket.durability
    return monitor is not None and monitor.durability_possible


def sync_write(
    conn: Connection,
    req: Any,
    handler: Callable[[Connection, Any], object],
    requirement: DurabilityRequirement,
) -> PendingAnswer:
    """Run ``handler`` on ``req`` as a SyncWrite; its refusal raises as the handler's would."""
    vbucket = active(conn, req.vbucket)
    pending = PendingAnswer(conn, req, vbucket, LEVEL_LABELS[requirement.level])
    try:
        vbucket.sync_write(
            lambda: handler(conn, req),
            requirement.level,
            timeout_ms=requirement.timeout_ms,
            cookie=pending,
        )
    except EngineError as exc:
        raise refusal(conn, exc) from None
    conn.server.sync_counts(conn.bucket_name or "")[0] += 1
    return pending


def deliver(outcomes: list[SyncOutcome]) -> None:
    """Answer the clients of decided SyncWrites (on the loop)."""
    for outcome in outcomes:
        cookie = outcome.cookie
        if isinstance(cookie, PendingAnswer):
            server = cookie.conn.server
            committed = outcome.status == Status.Success
            server.sync_counts(cookie.conn.bucket_name or "")[1 if committed else 2] += 1
            if committed:
                server.sync_duration(cookie.level).observe(perf_counter_ns() - cookie.started)
            cookie.resolve(outcome.status, outcome.item)

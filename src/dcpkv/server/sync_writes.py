"""Requests with a durability requirement (SyncWrites) on the front end: PROTOCOL.md, "SyncWrites".

Theory of operation
-------------------
The dispatcher (:mod:`dcpkv.server.dispatch`, step 3) hands a request whose framing extras
carry a durability requirement here, after its gates (and a mutation without one on a bucket
with a ``durability_min_level``, given that level):

============================================ ==================================================
request                                      answer
============================================ ==================================================
a route that takes no durability (reads,     Einval
sub-document lookups, Touch...)
its vbucket active here without a topology   DurabilityImpossible (a standalone node, or a
(or with one that cannot reach a majority)   cluster whose manager set none)
anything else                                the handler runs as a SyncWrite
                                             (:meth:`VBucket.sync_write`): its refusals are
                                             answered at once; its write becomes a prepare,
                                             and the request is answered later
============================================ ==================================================

Every mutation route (:data:`SYNC_WRITE_OPS`: Set, Add, Replace, Delete, Append, Prepend,
Incr, Decr and the sub-document mutations, and the quiet forms) takes the one write path: the
handler runs as it always does, and the version it makes becomes the prepare. Its answer, built
from the prepare (Incr's counter, a sub-document mutation's results), is kept and sent once the
prepare commits, re-stamped with the commit's CAS (and, with MutationSeqno, the commit's seqno:
:func:`restamp`).

The later answer is a :class:`PendingAnswer`, the cookie the vbucket hands back with the
outcome: the kept answer once the prepare commits; SyncWriteAmbiguous when it times out or the
vbucket leaves the active state. Outcomes arrive from the loop or the flusher thread; the
shell delivers them on the loop (:func:`deliver`). Answers keep the request order: the shell
holds every answer of a later request on the connection until the pending one before it is
decided, unless the connection's Hello asked for UnorderedExecution (the official SDKs do):
then later requests are answered at once and a SyncWrite's answer goes out when decided.
Requests still execute in order either way; only answers pass one another.

A node's name in a topology is the name the manager's map gives it (``thisNode``,
:attr:`ServerState.cluster_name`): the first chain of a SetVbucket topology must name this node
once a map did; a replica's DCP connection names itself so too (``consumer_name``).
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.item import EngineError, Item
from dcpkv.engine.vbucket import SyncOutcome, VBucket
from dcpkv.protocol import kv, subdoc
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import DurabilityLevel, Opcode
from dcpkv.protocol.durability import DurabilityRequirement
from dcpkv.server.connection import Connection
from dcpkv.server.kv_handlers import active, refusal

SYNC_WRITE_OPS = frozenset(
    {
        Opcode.Set, Opcode.SetQ, Opcode.Add, Opcode.AddQ, Opcode.Replace, Opcode.ReplaceQ,
        Opcode.Delete, Opcode.DeleteQ, Opcode.Append, Opcode.Prepend, Opcode.Increment,
        Opcode.Decrement,
    }
    | (subdoc.ALL_OPS - subdoc.LOOKUP_OPS)
)  # fmt: skip

# A level as the reference's metrics label it (kv_sync_write_commit_duration_seconds{level})
LEVEL_LABELS = {
    DurabilityLevel.Majority: "majority",
    DurabilityLevel.MajorityAndPersistToActive: "majority_and_persist_on_master",
    DurabilityLevel.PersistToMajority: "persist_to_majority",
}

NO_TOPOLOGY = (
    b"durability requirements are not supported on this vbucket: it has no replication "
    b"topology that can satisfy one (synchronous replication needs the cluster manager's)"
)


class PendingAnswer:
    """A SyncWrite's answer to come: its request, the handler's answer built from the prepare
    (None: a quiet opcode's), and the bytes once decided."""

    __slots__ = (
        "answer", "conn", "handled", "level", "on_ready", "outcome", "prepared", "req",
        "started", "vbucket",
    )  # fmt: skip

    def __init__(self, conn: Connection, req: kv.Request, vbucket: VBucket, level: str) -> None:
        self.conn, self.req, self.vbucket = conn, req, vbucket
        self.prepared: Message | None = None
        self.handled = False  # the handler returned: ``prepared`` is its answer
        self.outcome: tuple[Status, Item | None] | None = None
        self.level = level  # (the metric's label: LEVEL_LABELS)
        self.started = perf_counter_ns()  # (the commit's duration, a metric)
        self.answer: bytes | None = None
        # The shell's hook: an answer held behind this one may go out now.
        self.on_ready: Callable[[], None] | None = None

    def resolve(self, status: Status, item: Item | None) -> None:
        """Decided: the answer is built now, or, when decided inside its own request (a
        majority of one commits at once, answered on the loop), once the handler returned."""
        self.outcome = (status, item)
        if self.handled:
            self._build()

    def handler_answered(self, answer: Message | None) -> None:
        self.prepared, self.handled = answer, True
        if self.outcome is not None:
            self._build()

    def _build(self) -> None:
        assert self.outcome is not None
        (status, item), req = self.outcome, self.req
        if status == Status.Success and item is not None:
            answer = self.prepared
            self.answer = b"" if answer is None else restamp(answer, item).encode()
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
        answer = vbucket.sync_write(
            lambda: handler(conn, req),
            requirement.level,
            timeout_ms=requirement.timeout_ms,
            cookie=pending,
        )
    except EngineError as exc:
        raise refusal(conn, exc) from None
    if answer is not None and not isinstance(answer, Message):
        raise AssertionError(f"a mutation's handler answered {type(answer).__name__}")
    pending.handler_answered(answer)
    conn.server.sync_counts(conn.bucket_name or "")[0] += 1
    return pending


_SEQNO_EXTRAS = 16  # a sub-document mutation's (vbucket uuid, seqno) extras, with MutationSeqno


def restamp(answer: Message, commit: Item) -> Message:
    """``answer``, built from a prepare, as the commit's: its CAS, and its seqno where the
    answer carries one (MutationSeqno)."""
    answer.cas = commit.cas
    if getattr(answer, "seqno", None) is not None:
        answer.seqno = commit.by_seqno  # type: ignore[attr-defined]
    elif isinstance(answer, GenericResponse) and len(answer.extras) == _SEQNO_EXTRAS:
        answer.extras = bytes(answer.extras[:8]) + commit.by_seqno.to_bytes(8, "big")
    return answer


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

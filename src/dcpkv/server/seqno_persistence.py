"""SeqnoPersistence (0xb7): a request answered once the vbucket has persisted through a seqno.

Theory of operation
-------------------
Spec 002's second way for a front-end client to ensure persistence ("the client makes a new
type of connection, sends the sequence # and partition ID and failover ID, and the server
blocks until persistence has completed through that sequence"), on the active or on a
replica. :func:`outcome` decides, without I/O, from the vbucket's state, failover log and
persisted seqno:

=============================================  ============================================
the vbucket here                               answer
=============================================  ============================================
absent, or dead                                NotMyVbucket (with the map)
uuid given, not in its failover log            KeyEnoent: the history does not hold it
uuid given, a newer branch began below seqno   KeyEnoent: the write is not on this history
persisted through seqno                        Success (empty)
otherwise                                      wait
=============================================  ============================================

A request that must wait is parked (:class:`Waiter`, in ``ServerState.persistence_waiters``)
and the connection goes on serving others; the server re-decides every parked request after
each flusher round (:func:`answer_waiters`), which is also when a replica's applied snapshots
are visible as persisted, and answers Etmpfail to one still waiting after
:data:`WAIT_LIMIT_S`. A vbucket that moved or failed over meanwhile gets the table's answer
at the next round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol import kv
from dcpkv.protocol.base import GenericResponse
from dcpkv.protocol.constants import Opcode
from dcpkv.server.connection import Connection, Reply, not_my_vbucket

WAIT_LIMIT_S = 30.0
WAIT = None  # the outcome "not yet"


def outcome(
    state: VBucketState | None,
    entries: tuple[FailoverEntry, ...] | list[FailoverEntry],
    persisted: int,
    seqno: int,
    uuid: int,
) -> Status | None:
    """The table of the module docstring: a status to answer, or WAIT."""
    if state is None or state == VBucketState.DEAD:
        return Status.NotMyVbucket
    if uuid:
        index = next((i for i, e in enumerate(entries) if e.uuid == uuid), None)
        if index is None or (index > 0 and entries[index - 1].seqno < seqno):
            return Status.KeyEnoent
    return Status.Success if persisted >= seqno else WAIT


@dataclass(slots=True)
class Waiter:
    conn: Connection
    bucket: Any
    vbucket: int
    seqno: int
    uuid: int
    opaque: int
    deadline: float


def _decide(bucket: Any, vb: int, seqno: int, uuid: int) -> Status | None:
    vbucket = bucket.vbuckets.get(vb)
    if vbucket is None:
        return Status.NotMyVbucket
    with vbucket.lock:
        return outcome(
            vbucket.state, vbucket.failover.entries, vbucket.persisted_seqno, seqno, uuid
        )


def _answer(conn: Connection, status: Status, opaque: int) -> GenericResponse | Reply:
    if status == Status.NotMyVbucket:
        return not_my_vbucket(conn)
    if status == Status.KeyEnoent:
        return Reply(status, b"the vbucket's history no longer holds that seqno of that uuid")
    return GenericResponse(opcode=Opcode.SeqnoPersistence, opaque=opaque, status=status)


def seqno_persistence(conn: Connection, req: kv.SeqnoPersistence) -> GenericResponse | None:
    """The handler: the answer now, or None (parked until a flusher round decides)."""
    status = _decide(conn.bucket, req.vbucket, req.seqno, req.vbucket_uuid)
    if status is WAIT:
        conn.server.persistence_waiters.append(
            Waiter(conn, conn.bucket, req.vbucket, req.seqno, req.vbucket_uuid, req.opaque,
                   time.monotonic() + WAIT_LIMIT_S)
        )  # fmt: skip
        return None
    answer = _answer(conn, status, req.opaque)
    if isinstance(answer, Reply):
        raise answer
    return answer


def answer_waiters(waiters: list[Waiter]) -> None:
    """Re-decide every parked request (after a flusher round); answer the decided ones."""
    now = time.monotonic()
    keep = []
    for w in waiters:
        status = _decide(w.bucket, w.vbucket, w.seqno, w.uuid)
        if status is WAIT and now < w.deadline:
            keep.append(w)
            continue
        answer = _answer(w.conn, Status.Etmpfail if status is WAIT else status, w.opaque)
        if isinstance(answer, Reply):
            answer = GenericResponse(
                opcode=Opcode.SeqnoPersistence, opaque=w.opaque, status=answer.status,
                value=answer.value,
            )  # fmt: skip
        w.conn.send(answer.encode())
    waiters[:] = keep

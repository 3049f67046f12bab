"""Vbucket control: the states a node holds its vbuckets in, and their seqnos.

Theory of operation
-------------------
State changes are ordered by the bucket's state CAS (spec 002): SetVbucket and DelVbucket carry
it in the header's CAS (0: unconditional); a stale one is refused with KeyExists and the current
CAS, and changes nothing; an accepted one answers with the new CAS. GetVbucket answers the
current CAS too (in its NotMyVbucket answer as well), which is how a manager discovers it.

SetVbucket creates a vbucket or changes its state (the DCP producers of the bucket hear of it
through the bucket's state listeners and end the streams that must end); GetVbucket reads a
state; DelVbucket drops a vbucket and its data; GetAllVbSeqnos lists high seqnos, optionally of
one state only (dead vbuckets are left out unless asked for). SetVbucket's optional JSON value
``{"topology": [[...], [...]]}`` gives an active vbucket the chains its SyncWrites must reach
(:mod:`dcpkv.core.replication_topology`; the first chain's active is this node, named as
:attr:`~dcpkv.server.state.ServerState.cluster_name` says); given with the pending state (a
rebalance's new copy), it is the topology the copy takes when its takeover makes it active. A
malformed one is refused with Einval and changes nothing. On a cluster, the manager is the
one client of these opcodes.
"""

from __future__ import annotations

from dcpkv.core.replication_topology import ReplicationTopology, TopologyError, parse_topology
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.item import EngineError
from dcpkv.protocol import kv
from dcpkv.protocol.base import GenericResponse
from dcpkv.server.connection import Connection, Reply, check_term, not_my_vbucket
from dcpkv.server.kv_handlers import present, refusal


def set_vbucket(conn: Connection, req: kv.SetVbucket) -> GenericResponse:
    check_term(conn, f"SetVbucket {req.vbucket}")
    bucket = conn.bucket
    if not 0 <= req.vbucket < bucket.num_vbuckets:
        raise Reply(Status.Einval, b"vbucket id out of range")
    state = VBucketState(req.state)
    topology = _topology(conn, req, state)
    try:
        vbucket = bucket.set_vbucket_state(req.vbucket, state, cas=req.cas)
        if topology is not None and state == VBucketState.PENDING:
            vbucket.set_takeover_topology(topology)
        elif topology is not None:
            vbucket.set_topology(topology)
    except EngineError as exc:
        raise refusal(conn, exc) from None
    return GenericResponse(opcode=req.opcode, opaque=req.opaque, cas=bucket.state_cas)


def _topology(
    conn: Connection, req: kv.SetVbucket, state: VBucketState
) -> ReplicationTopology | None:
    """The replication topology SetVbucket's value carries (None: none); Einval when it is
    malformed, names another node as the first chain's active, or the state is not active.
    Checked before the state changes, so a refused request changes nothing. The active's name
    is checked against the one the manager's map gives this node; before a map names it (a
    bucket's first states come before its first map), the manager's word is taken."""
    if not req.meta:
        return None
    if state not in (VBucketState.ACTIVE, VBucketState.PENDING):
        raise Reply(
            Status.Einval, b"a replication topology is for an active or pending vbucket only"
        )
    try:
        return parse_topology(bytes(req.meta), conn.server.cluster_name)
    except TopologyError as exc:
        raise Reply(Status.Einval, str(exc).encode()[:1024]) from None


def get_vbucket(conn: Connection, req: kv.GetVbucket) -> kv.GetVbucketResponse:
    if req.vbucket not in conn.bucket.vbuckets:
        # Still the state CAS: how a manager reads it from a node that holds nothing yet.
        refused = not_my_vbucket(conn)
        refused.cas = conn.bucket.state_cas
        raise refused
    vbucket = present(conn, req.vbucket)
    return kv.GetVbucketResponse(opaque=req.opaque, state=vbucket.state, cas=conn.bucket.state_cas)


def del_vbucket(conn: Connection, req: kv.DelVbucket) -> GenericResponse:
    check_term(conn, f"DelVbucket {req.vbucket}")
    present(conn, req.vbucket)
    bucket = conn.bucket
    # Storage I/O on the loop: rare and admin-only; the bucket's I/O lock orders it against
    # the flusher thread.
    try:
        bucket.delete_vbucket(req.vbucket, cas=req.cas)
    except EngineError as exc:
        raise refusal(conn, exc) from None
    return GenericResponse(opcode=req.opcode, opaque=req.opaque, cas=bucket.state_cas)


def all_vb_seqnos(conn: Connection, req: kv.GetAllVbSeqnos) -> kv.GetAllVbSeqnosResponse:
    wanted = VBucketState(req.state) if req.state else None
    vbuckets = conn.bucket.vbuckets
    seqnos = tuple(
        (vb, vbuckets[vb].high_seqno)
        for vb in sorted(vbuckets)
        if (vbuckets[vb].state == wanted if wanted else vbuckets[vb].state != VBucketState.DEAD)
    )
    return kv.GetAllVbSeqnosResponse(opaque=req.opaque, seqnos=seqnos)

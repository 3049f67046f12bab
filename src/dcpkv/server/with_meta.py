"""With-meta writes (XDCR): SetWithMeta, AddWithMeta, DelWithMeta and their quiet forms.

Theory of operation
-------------------
A replicator writes a document into this cluster with the metadata it had at its source:
flags, expiry, rev seqno and CAS come from the request's extras and are stored as they are;
the write takes the next seqno of the local vbucket, so DCP streams it like any change. What
happens, in order (PROTOCOL.md, "Cross data centre replication (XDCR) facts"):

1. the codec refused extras of a length other than 24, 26, 28 or 30 (Einval);
2. the options word: an unknown bit, REGENERATE_CAS without SKIP_CONFLICT_RESOLUTION, or
   FORCE_ACCEPT on a revision-based bucket is Einval; IS_EXPIRATION only on a delete;
3. the value: ``nmeta`` extended-meta bytes ending it are dropped; a DelWithMeta carries
   nothing or xattrs only; the datatype bits are checked as for any write;
4. the engine (:meth:`dcpkv.engine.vbucket.VBucket.write_with_meta`): the header's CAS is an
   ordinary compare-and-swap; AddWithMeta is refused (KeyExists) when a live document exists;
   unless FORCE or SKIP_CONFLICT_RESOLUTION, conflict resolution
   (:mod:`dcpkv.core.conflict_resolution`) refuses a losing or identical version with
   KeyExists, which a replicator counts as "failed conflict resolution at the target".

The success answer is a mutation's (the stored CAS; the vbucket uuid and seqno with
MutationSeqno); the quiet forms answer only a refusal.
"""

from __future__ import annotations

from dcpkv.core.conflict_resolution import ConflictMode
from dcpkv.core.status import Status
from dcpkv.engine import document
from dcpkv.engine.item import EngineError, Item
from dcpkv.protocol import kv
from dcpkv.protocol.constants import Opcode
from dcpkv.protocol.kv import WithMetaOption as Option
from dcpkv.server import datatype
from dcpkv.server.connection import Connection, Reply
from dcpkv.server.kv_handlers import active, mutation_answer, refusal

_QUIET = frozenset({Opcode.SetqWithMeta, Opcode.AddqWithMeta, Opcode.DelqWithMeta})
_ADD = frozenset({Opcode.AddWithMeta, Opcode.AddqWithMeta})
_DELETE = frozenset({Opcode.DelWithMeta, Opcode.DelqWithMeta})
_KNOWN = int(
    Option.FORCE | Option.FORCE_ACCEPT | Option.REGENERATE_CAS
    | Option.SKIP_CONFLICT_RESOLUTION | Option.IS_EXPIRATION
)  # fmt: skip
# The options as plain ints: an int & an IntFlag member builds an IntFlag (the reflected
# operator), which cost a with-meta write a sixth of its time on the server.
_FORCE, _FORCE_ACCEPT = int(Option.FORCE), int(Option.FORCE_ACCEPT)
_REGENERATE_CAS, _SKIP_CR = int(Option.REGENERATE_CAS), int(Option.SKIP_CONFLICT_RESOLUTION)
_IS_EXPIRATION = int(Option.IS_EXPIRATION)


def with_meta(conn: Connection, req: kv.SetWithMeta) -> kv.MutationResponse | None:
    """SetWithMeta, AddWithMeta, DelWithMeta and their quiet forms (module docstring)."""
    options = req.options or 0
    _check_options(conn, options, req.opcode in _DELETE)
    vbucket = active(conn, req.vbucket)
    incoming = _incoming(conn, req, options)
    try:
        item = vbucket.write_with_meta(
            incoming,
            check_conflict=not options & (_FORCE | _SKIP_CR),
            regenerate_cas=bool(options & _REGENERATE_CAS),
            add=req.opcode in _ADD,
            cas=req.cas,
        )
    except EngineError as exc:
        raise refusal(conn, exc) from None
    if req.opcode in _QUIET:
        return None
    return mutation_answer(conn, kv.WITH_META_RESPONSES[req.opcode], req, vbucket, item)


def _check_options(conn: Connection, options: int, delete: bool) -> None:
    if options & ~_KNOWN:
        raise Reply(Status.Einval, f"unknown with-meta options 0x{options:x}".encode())
    if options & _REGENERATE_CAS and not options & _SKIP_CR:
        raise Reply(Status.Einval, b"regenerate CAS needs skip conflict resolution")
    if options & _FORCE_ACCEPT and conn.bucket.conflict_mode is not ConflictMode.LWW:
        raise Reply(Status.Einval, b"force-accept is for timestamp (lww) buckets")
    if options & _IS_EXPIRATION and not delete:
        raise Reply(Status.Einval, b"is-expiration is for DelWithMeta")


def _incoming(conn: Connection, req: kv.SetWithMeta, options: int) -> Item:
    """The version the request describes (not yet given a seqno)."""
    value = bytes(req.value)
    if req.nmeta:
        if req.nmeta > len(value):
            raise Reply(Status.Einval, b"nmeta is longer than the value")
        value = value[: len(value) - req.nmeta]
    value, dt = datatype.accept(conn, value, req.datatype) if value else (b"", 0)
    if req.opcode not in _DELETE:
        return Item(
            bytes(req.key), value, req.flags, req.expiration, req.meta_cas, req.rev_seqno, 0, dt
        )
    if value and not dt & document.XATTR:
        raise Reply(Status.Einval, b"DelWithMeta carries no value but xattrs")
    expired = bool(options & _IS_EXPIRATION)
    delete_time = req.expiration or int(conn.bucket.clock.time())
    return Item(
        bytes(req.key), value, req.flags, 0, req.meta_cas, req.rev_seqno, 0, dt,
        deleted=True, delete_time=delete_time, expired=expired,
    )  # fmt: skip

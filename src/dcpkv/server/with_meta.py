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
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import kv
from dcpkv.protocol.constants import Opcode
from dcpkv.protocol.kv import WithMetaOption as Option
from dcpkv.server import datatype
from dcpkv.server.connection import Connection, Reply
from dcpkv.server.kv_handlers import active, mutation_answer, refusal

QUIET = frozenset({Opcode.SetqWithMeta, Opcode.AddqWithMeta, Opcode.DelqWithMeta})
_ADD = frozenset({Opcode.AddWithMeta, Opcode.AddqWithMeta})
DELETES = frozenset({Opcode.DelWithMeta, Opcode.DelqWithMeta})
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
    options, opcode = req.options or 0, req.opcode
    refused = options_refusal(conn, options, opcode in DELETES)
    if refused is not None:
        raise refused
    vbucket = active(conn, req.vbucket)
    value, dt = _value(conn, req)
    incoming = incoming_item(
        conn, opcode, bytes(req.key), value, dt, req.flags, req.expiration, req.rev_seqno,
        req.meta_cas, options,
    )  # fmt: skip
    try:
        item = store(vbucket, opcode, incoming, options, req.cas)
    except EngineError as exc:
        raise refusal(conn, exc) from None
    if opcode in QUIET:
        return None
    return mutation_answer(conn, kv.WITH_META_RESPONSES[opcode], req, vbucket, item)


def options_refusal(conn: Connection, options: int, delete: bool) -> Reply | None:
    """Step 2 of the module docstring: the refusal of an options word (None: accepted)."""
    if options & ~_KNOWN:
        return Reply(Status.Einval, f"unknown with-meta options 0x{options:x}".encode())
    if options & _REGENERATE_CAS and not options & _SKIP_CR:
        return Reply(Status.Einval, b"regenerate CAS needs skip conflict resolution")
    if options & _FORCE_ACCEPT and conn.bucket.conflict_mode is not ConflictMode.LWW:
        return Reply(Status.Einval, b"force-accept is for timestamp (lww) buckets")
    if options & _IS_EXPIRATION and not delete:
        return Reply(Status.Einval, b"is-expiration is for DelWithMeta")
    return None


def _value(conn: Connection, req: kv.SetWithMeta) -> tuple[bytes, int]:
    """Step 3 of the module docstring: the value to store and its datatype."""
    value = bytes(req.value)
    if req.nmeta:
        if req.nmeta > len(value):
            raise Reply(Status.Einval, b"nmeta is longer than the value")
        value = value[: len(value) - req.nmeta]
    value, dt = datatype.accept(conn, value, req.datatype) if value else (b"", 0)
    if value and req.opcode in DELETES and not dt & document.XATTR:
        raise Reply(Status.Einval, b"DelWithMeta carries no value but xattrs")
    return value, dt


def incoming_item(
    conn: Connection, opcode: int, key: bytes, value: bytes, dt: int, flags: int,
    expiration: int, rev_seqno: int, meta_cas: int, options: int,
) -> Item:  # fmt: skip
    """The version a with-meta write of ``opcode`` describes (not yet given a seqno), from
    its accepted value (step 3) and its extras: an empty value has no datatype; a deletion
    stores no expiry but its delete time (its expiration, else now)."""
    if not value:
        dt = 0
    if opcode not in DELETES:
        return Item(key, value, flags, expiration, meta_cas, rev_seqno, 0, dt)
    expired = bool(options & _IS_EXPIRATION)
    delete_time = expiration or int(conn.bucket.clock.time())
    return Item(
        key, value, flags, 0, meta_cas, rev_seqno, 0, dt,
        deleted=True, delete_time=delete_time, expired=expired,
    )  # fmt: skip


def store(vbucket: VBucket, opcode: int, incoming: Item, options: int, cas: int) -> Item:
    """Step 4 of the module docstring: ``incoming`` written by the engine with what
    ``opcode`` and ``options`` ask (conflict resolution unless forced, a new CAS, add); the
    stored item, or the engine's refusal (EngineError)."""
    return vbucket.write_with_meta(
        incoming,
        check_conflict=not options & (_FORCE | _SKIP_CR),
        regenerate_cas=bool(options & _REGENERATE_CAS),
        add=opcode in _ADD,
        cas=cas,
    )

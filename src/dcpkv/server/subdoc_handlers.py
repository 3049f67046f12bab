"""Sub-document opcodes (0xc5-0xd2): lookups and mutations of parts of a document.

Theory of operation
-------------------
The codec gives one :class:`~dcpkv.protocol.subdoc.SubdocRequest` (single-path requests are
one spec); the engine's :mod:`dcpkv.engine.subdoc` decides everything about the document; this
handler only reads or edits the vbucket and writes the answer in the layout of the opcode:

* a lookup reads the document as it is (a tombstone too, with the AccessDeleted doc flag) and
  answers per spec; a single path answers its own status;
* a mutation is one :meth:`~dcpkv.engine.vbucket.VBucket.edit`: the specs are applied under
  the vbucket's lock with the CAS and seqno the write gets, so it is one atomic change and one
  DCP mutation, or nothing (the first failing spec's index and status, MultiPathFailure).

A success on a deleted document answers SubdocSuccessDeleted; MutationSeqno extras ride on
mutation answers as on every other mutation.
"""

from __future__ import annotations

import struct

from dcpkv.core.status import Status
from dcpkv.engine import document, subdoc
from dcpkv.engine.item import EngineError, Item
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import subdoc as codec
from dcpkv.protocol.base import GenericResponse
from dcpkv.protocol.constants import Datatype, HelloFeature
from dcpkv.server.connection import Connection, Reply
from dcpkv.server.kv_handlers import active, refusal

_SEQNO_EXTRAS = struct.Struct(">QQ")


def subdoc_request(conn: Connection, req: codec.SubdocRequest) -> GenericResponse:
    vbucket = active(conn, req.vbucket)
    try:
        if req.is_lookup:
            return _lookup(vbucket, req)
        return _mutate(conn, vbucket, req)
    except subdoc.SubdocError as exc:
        raise Reply(exc.status, str(exc).encode()) from None
    except EngineError as exc:
        raise refusal(conn, exc) from None


def _answer(req: codec.SubdocRequest, status: int, **fields: object) -> GenericResponse:
    return GenericResponse(opcode=req.opcode, opaque=req.opaque, status=status, **fields)  # type: ignore[arg-type]


def _lookup(vbucket: VBucket, req: codec.SubdocRequest) -> GenericResponse:
    item = vbucket.read_any(bytes(req.key))
    status, results = subdoc.lookup(
        item, list(req.specs), req.doc_flags, lambda it: subdoc.document_vattr(it, vbucket.uuid)
    )
    assert item is not None  # lookup raised KeyEnoent otherwise
    if req.is_multi:
        value = codec.lookup_results([(r.status, r.value) for r in results])
        return _answer(req, status, cas=item.cas, value=value)
    (result,) = results
    if result.status != Status.Success:
        return _answer(req, result.status, cas=item.cas)
    datatype = Datatype.JSON if result.value else 0
    return _answer(req, status, cas=item.cas, value=result.value, datatype=datatype)


def _mutate(conn: Connection, vbucket: VBucket, req: codec.SubdocRequest) -> GenericResponse:
    specs: list[codec.Spec] = list(req.specs)
    results: list[tuple[int, bytes]] = []

    mode = conn.bucket.compression_mode

    def change(current: Item | None, cas: int, seqno: int) -> subdoc.Mutated:
        out = subdoc.mutate(current, specs, req.doc_flags, req.cas, cas, seqno)
        out.value, out.datatype = document.store_form(out.value, out.datatype, mode)
        results[:] = out.results
        return out

    try:
        item = vbucket.edit(bytes(req.key), change, expiry=req.expiry)
    except subdoc.SpecFailed as exc:
        if not req.is_multi:
            raise Reply(exc.status) from None
        failure = codec.mutation_failure(exc.index, exc.status)
        return _answer(req, Status.SubdocMultiPathFailure, value=failure)
    extras = b""
    if HelloFeature.MutationSeqno in conn.features:
        extras = _SEQNO_EXTRAS.pack(vbucket.uuid, item.by_seqno)
    status = Status.SubdocSuccessDeleted if item.deleted else Status.Success
    # a single path answers the counter's value, if any
    single = next((v for _, v in results), b"")
    value = codec.mutation_results(results) if req.is_multi else single
    return _answer(req, status, cas=item.cas, extras=extras, value=value)

"""The request fast path: pipelined Gets and Sets of plain values, answered from the read buffer.

Theory of operation
-------------------
Nearly every request a data server sees is a Get or a Set (a target cluster of XDCR: a
with-meta write). The general path
(:class:`~dcpkv.protocol.frame.FrameParser` -> ``Frame`` -> route -> decoded message ->
handler -> response message -> bytes) builds four objects per request, and that object churn,
not the work, was most of a request's cost. :func:`serve_plain` walks the whole classic frames
at the start of a chunk and answers in place those of the common shape:

========== ============================================================================
Get, GetQ  magic 0x80, no extras, a key of 1..250 bytes, no value (GetK, GetKQ too: their
           answers carry the key)
Set, SetQ  magic 0x80, 8 bytes of extras, a key, no CAS, a plain or JSON datatype, the
           bucket not compressing
with-meta  SetWithMeta, AddWithMeta, DelWithMeta and their quiet forms (XDCR's writes):
           magic 0x80, 24 or 28 bytes of extras (no nmeta), a key, no CAS, a plain or
           JSON datatype (a deletion: no value), options the general path accepts, the
           bucket not compressing
========== ============================================================================

with the engine's :meth:`~dcpkv.engine.vbucket.VBucket.get_resident` (the first step of its
Get) and :meth:`~dcpkv.engine.vbucket.VBucket.get_nonresident` (its steps that answer a key
evicted under full eviction without a read: from a background fetch that landed, as when a
connection's pipelined Gets run again, or a miss storage's filters rule out),
:meth:`~dcpkv.engine.vbucket.VBucket.set` (its one Set), and for a with-meta write the general
handler's own steps (:mod:`dcpkv.server.with_meta`: the options' refusal, the incoming item,
the engine's write), only read from the bytes. It stops at the first frame that is anything
else (another opcode, a flex frame, a partial frame, a gate the user does not pass, a value
with xattrs or compressed, a Get the engine cannot answer from memory) and returns where it
stopped; the caller gives that frame, with the whole frames right after it whose opcodes this
module never serves (:func:`general_run_end`), to the parser and the general path
(:mod:`dcpkv.server.dispatch`) and comes back here for the next; a partial frame and what
follows it go to the parser. A declined frame has changed nothing, so the general path answers
it exactly as if this module did not exist; a test holds both paths to the same bytes. An
engine refusal (KeyEnoent, TempFail, NotMyVbucket) is answered here, as the general path would
answer it.

The gates are the dispatch table's (:func:`~dcpkv.server.dispatch.closed_gate` on the route of
the opcode: authenticated, bucket selected, the route's privileges on it), asked once per chunk
for each opcode met: nothing in a chunk can change them before the first request that takes
the general path. The wire layouts are the codec's (:mod:`dcpkv.protocol.kv`).
"""

from __future__ import annotations

from collections.abc import Callable

from dcpkv.core.status import Status
from dcpkv.engine.bg_fetch import WouldBlock
from dcpkv.engine.document import SHAPED, CompressionMode
from dcpkv.engine.item import EngineError, KeyNotFound
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import kv
from dcpkv.protocol.base import GenericResponse
from dcpkv.protocol.constants import HEADER_LEN, MAX_KEY_LEN, Datatype, HelloFeature, Magic, Opcode
from dcpkv.protocol.frame import HEADER, FrameParser, body_length
from dcpkv.server import with_meta
from dcpkv.server.connection import Connection
from dcpkv.server.dispatch import ROUTES, closed_gate
from dcpkv.server.kv_handlers import refusal

# The general path for some bytes: parser + dispatcher; False once the connection closes.
General = Callable[[bytes, list[bytes]], bool]
# A request header as HEADER unpacks it: magic, opcode, key length, extras length, datatype,
# vbucket, body length, opaque, CAS (one tuple, made anyway, handed on whole).
Header = tuple[int, int, int, int, int, int, int, int, int]
_REQUEST = int(Magic.ClientRequest)
_RESPONSE = int(Magic.ClientResponse)
_GET = int(Opcode.Get)
_SET = int(Opcode.Set)
_GETQ = int(Opcode.GetQ)
_GETK = int(Opcode.GetK)
_GETKQ = int(Opcode.GetKQ)
_QUIET_GETS = frozenset({_GETQ, _GETKQ})
_KEYED_GETS = frozenset({_GETK, _GETKQ})
_SETQ = int(Opcode.SetQ)
_NOT_JSON = 0xFF & ~int(Datatype.JSON)
_SET_EXTRAS = kv.FLAGS_EXPIRY.size
_META_EXTRAS = kv.WITH_META.size  # (no options word)
_META_OPTIONS_EXTRAS = kv.WITH_META_OPTIONS.size
_WITH_META = frozenset(int(op) for op in kv.WITH_META_RESPONSES)
_META_QUIET = frozenset(int(op) for op in with_meta.QUIET)
_META_DELETES = frozenset(int(op) for op in with_meta.DELETES)
# (The layouts are used as ``kv.NAME.pack``: Python 3.11 compiles a method call on a name bound
# by ``from ... import`` as an attribute load that builds a bound method each time, ~450 more
# machine instructions per call, counted with callgrind.)


def _refused(conn: Connection, opcode: int, opaque: int, exc: EngineError) -> bytes:
    reply = refusal(conn, exc)
    return GenericResponse(
        opcode=opcode, opaque=opaque, status=reply.status, value=reply.value, cas=reply.cas
    ).encode()


class _Chunk:
    """What serving one chunk needs, looked up once: the gates, the bucket, the features."""

    __slots__ = (
        "append", "conn", "mask", "max_value", "plain_values", "plain_writes", "seqnos",
        "serving",
    )  # fmt: skip

    def __init__(self, conn: Connection, out: list[bytes], max_value: int) -> None:
        self.conn, self.append, self.max_value = conn, out.append, max_value
        # opcode -> how it is answered here, once its route's gates have passed (serve_for)
        self.serving: dict[int, Serve] = {}
        # A bucket that compresses what it stores takes no value as it comes (kv_handlers);
        # one with a minimum durability level makes every write a SyncWrite (dispatch).
        bucket = conn.bucket
        self.plain_values = bucket.compression_mode is not CompressionMode.ACTIVE
        self.plain_writes = self.plain_values and bucket.durability_min_level is None
        self.mask = conn.datatype_mask
        self.seqnos = HelloFeature.MutationSeqno in conn.features

    def serve_for(self, opcode: int) -> Serve | None:
        """How ``opcode`` is answered here, if it is one of this module's and the connection
        passes the gates of its route (the dispatch table's, as the general path asks them);
        None otherwise. Asked once per chunk and opcode."""
        serve = _SERVE.get(opcode)
        if serve is None or closed_gate(self.conn, ROUTES[opcode]) is not None:
            return None
        self.serving[opcode] = serve
        return serve

    def get(self, vbucket: VBucket, data: bytes, k: int, header: Header) -> bool:
        """Answer a plain Get or GetQ (True), or decline it (False, nothing done); its key
        starts at ``k`` in ``data``."""
        _, opcode, keylen, extlen, _, _, body, opaque, _ = header
        if extlen or body != keylen:
            return False
        key = data[k : k + keylen]
        try:
            item = vbucket.get_resident(key)
            if item is None and vbucket.hash_table.nonresident:
                item = vbucket.get_nonresident(key)  # (a fetch landed, or the filters' miss)
        except EngineError as exc:  # a miss: a quiet Get says nothing
            if opcode not in _QUIET_GETS:
                self.append(self._missed(opcode, opaque, key, exc))
            return True
        if item is None or item.datatype & SHAPED:
            return False
        value = item.value
        assert value is not None  # resident items and fetched versions have their value
        echoed = keylen if opcode in _KEYED_GETS else 0  # (a GetK's answer carries its key)
        self.append(kv.GET_HIT.pack(
            _RESPONSE, opcode, echoed, 4, item.datatype & self.mask, 0,
            4 + echoed + len(value), opaque, item.cas, item.flags,
        ))  # fmt: skip
        if echoed:
            self.append(bytes(key))
        self.append(value)
        return True

    def _missed(self, opcode: int, opaque: int, key: bytes, exc: EngineError) -> bytes:
        """A Get's or GetK's miss (a GetK's KeyEnoent carries the key, as the handler's)."""
        if opcode == _GETK and isinstance(exc, KeyNotFound):
            missing = GenericResponse(opcode=opcode, opaque=opaque, status=Status.KeyEnoent)
            missing.key = bytes(key)
            return missing.encode()
        return _refused(self.conn, opcode, opaque, exc)

    def set(self, vbucket: VBucket, data: bytes, k: int, header: Header) -> bool:
        """Answer a plain Set or SetQ (True), or decline it (False, nothing done); its key
        starts at ``k`` in ``data``."""
        _, opcode, keylen, extlen, datatype, _, body, opaque, cas = header
        value_end = k - extlen + body  # k is where the key starts, after the extras
        if (extlen != _SET_EXTRAS or cas or datatype & _NOT_JSON or not self.plain_writes
                or not 0 <= value_end - k - keylen <= self.max_value):  # fmt: skip
            return False
        flags, exptime = kv.FLAGS_EXPIRY.unpack_from(data, k - _SET_EXTRAS)
        v = k + keylen
        try:
            # (flags, expiry, datatype by position: keywords cost a Set ~40 ns)
            item = vbucket.set(data[k:v], data[v:value_end], flags, exptime, datatype)
        except EngineError as exc:  # TempFail (the memory quota, a failing disk), NotMyVbucket
            self.append(_refused(self.conn, opcode, opaque, exc))
            return True
        except WouldBlock:  # a non-resident key: the general path waits for its fetch
            return False
        if opcode == _SETQ:
            return True  # success: a SetQ says nothing
        if self.seqnos:
            self.append(kv.MUTATED.pack(_RESPONSE, _SET, 0, 16, 0, 0, 16, opaque, item.cas,
                                        vbucket.uuid, item.by_seqno))  # fmt: skip
        else:
            self.append(kv.SET_OK.pack(kv.SET_OK_HEAD, opaque, item.cas))
        return True

    def with_meta(self, vbucket: VBucket, data: bytes, k: int, header: Header) -> bool:
        """Answer a with-meta write of the common shape (True), or decline it (False,
        nothing done); its key starts at ``k`` in ``data``. A with-meta route needs no
        durability (dispatch): a bucket's minimum level does not concern it."""
        _, opcode, keylen, extlen, datatype, _, body, opaque, cas = header
        value_end = k - extlen + body
        v = k + keylen
        if (cas or datatype & _NOT_JSON or not self.plain_values
                or not 0 <= value_end - v <= self.max_value):  # fmt: skip
            return False
        if extlen == _META_EXTRAS:
            flags, expiration, rev_seqno, meta_cas = kv.WITH_META.unpack_from(data, k - extlen)
            options = 0
        elif extlen == _META_OPTIONS_EXTRAS:
            flags, expiration, rev_seqno, meta_cas, options = kv.WITH_META_OPTIONS.unpack_from(
                data, k - extlen
            )
        else:
            return False
        conn, delete = self.conn, opcode in _META_DELETES
        if (delete and v != value_end) or with_meta.options_refusal(conn, options, delete):
            return False  # (a tombstone's xattrs, a refused option: the general path)
        incoming = with_meta.incoming_item(
            conn, opcode, data[k:v], data[v:value_end], datatype, flags, expiration,
            rev_seqno, meta_cas, options,
        )  # fmt: skip
        try:
            item = with_meta.store(vbucket, opcode, incoming, options, 0)
        except EngineError as exc:  # KeyExists (lost conflict resolution), NotMyVbucket...
            self.append(_refused(conn, opcode, opaque, exc))
            return True
        except WouldBlock:  # a tombstone or a non-resident key: the general path waits
            return False
        if opcode in _META_QUIET:
            return True  # success: a quiet form says nothing
        if self.seqnos:
            self.append(kv.MUTATED.pack(_RESPONSE, opcode, 0, 16, 0, 0, 16, opaque, item.cas,
                                        vbucket.uuid, item.by_seqno))  # fmt: skip
        else:
            self.append(HEADER.pack(_RESPONSE, opcode, 0, 0, 0, 0, 0, opaque, item.cas))
        return True


Serve = Callable[[_Chunk, VBucket, bytes, int, Header], bool]
_SERVE: dict[int, Serve] = {
    _GET: _Chunk.get,
    _GETQ: _Chunk.get,
    _GETK: _Chunk.get,
    _GETKQ: _Chunk.get,
    _SET: _Chunk.set,
    _SETQ: _Chunk.set,
    **dict.fromkeys(_WITH_META, _Chunk.with_meta),
}


def serve_plain(conn: Connection, data: bytes, pos: int, out: list[bytes], max_value: int) -> int:
    """Answer (into ``out``) the plain Gets and Sets of ``data`` from ``pos``, a frame
    boundary, on; returns the offset of the first frame left for the general path."""
    if conn.bucket_name is None:  # nothing to serve from (the general path answers NoBucket)
        return pos
    chunk = _Chunk(conn, out, max_value)
    vbuckets = conn.bucket.vbuckets
    unpack, end, serving = HEADER.unpack_from, len(data), chunk.serving.get
    ops = conn.server.ops
    while end - pos >= HEADER_LEN:
        header = unpack(data, pos)
        magic, opcode, keylen, extlen, _, vb, body, _, _ = header
        size = HEADER_LEN + body
        serve = serving(opcode) or chunk.serve_for(opcode)
        if serve is None or magic != _REQUEST or size > end - pos or not 0 < keylen <= MAX_KEY_LEN:
            break
        vbucket = vbuckets.get(vb)
        if vbucket is None:
            break
        if not serve(chunk, vbucket, data, pos + HEADER_LEN + extlen, header):
            break
        ops[opcode] += 1
        pos += size
    return pos


def serve_chunk(
    conn: Connection, parser: FrameParser, data: bytes, out: list[bytes], general: General
) -> None:
    """Answer one chunk read from the connection whose ``parser`` holds what came before:
    runs of plain Gets and Sets here, any other whole frame by ``general`` alone (the parser
    and the dispatcher), a frame straddling the previous chunk by ``general`` first, and a
    partial frame with all after it by ``general``, which returns False once the connection
    closes or a request waits for a background fetch: the rest of the chunk then goes to the
    parser, which holds it until the request has been answered."""
    if conn.bucket_name is None or conn.dcp is not None:  # no gate passed yet, or a producer
        general(data, out)
        return
    pos, end = 0, len(data)
    if parser.buffered:
        head = parser.peek(HEADER_LEN)
        need = rest_of_frame(head + data[: HEADER_LEN - len(head)], parser.buffered, end)
        if need is None:  # the straddling frame goes on past this chunk
            general(data, out)
            return
        pos = need
        if not _general_until(general, parser, data, 0, pos, out):
            return
    while pos < end:
        if conn.dcp is None:  # (DcpOpen went through general: the rest does too)
            pos = serve_plain(conn, data, pos, out, parser.max_value_len)
            if pos == end:
                return
        frame_at = general_run_end(data, pos)
        if not _general_until(general, parser, data, pos, frame_at, out) or frame_at is None:
            return
        pos = frame_at


def _general_until(
    general: General, parser: FrameParser, data: bytes, pos: int, end: int | None,
    out: list[bytes],
) -> bool:  # fmt: skip
    """``general`` on ``data[pos:end]``; when it stops (the connection closes, or a request
    waits for a background fetch), what follows ``end`` goes to the parser, which holds it
    until then (a closing connection drops it with the parser)."""
    if general(data[pos:end], out):
        return True
    if end is not None:
        parser.feed(data[end:])
    return False


_GETS = frozenset({int(Opcode.Get), int(Opcode.GetQ), int(Opcode.GetK), int(Opcode.GetKQ)})


def pipelined_gets(
    views: list[bytes | memoryview], limit: int
) -> tuple[list[tuple[int, bytes]], int]:
    """The (vbucket, key) of the plain Gets among the first ``limit`` whole classic frames
    of ``views`` (a parser's buffered chunks), and how many frames were looked at: what a
    connection waiting for a background fetch will ask next (its keys are fetched in the
    same batch). Headers only; stops at a frame that is not whole in its chunk."""
    return pipelined_keys(views, limit, _GETS, bare=True)


def pipelined_keys(
    views: list[bytes | memoryview], limit: int, opcodes: frozenset[int], *, bare: bool = False
) -> tuple[list[tuple[int, bytes]], int]:
    """:func:`pipelined_gets` for the requests of ``opcodes`` (``bare``: only those with no
    extras and no value, as a plain Get has), e.g. the DCP mutations a replication link
    will apply next."""
    found: list[tuple[int, bytes]] = []
    seen = 0
    for view in views:
        pos, end = 0, len(view)
        while seen < limit and end - pos >= HEADER_LEN:
            magic, opcode, keylen, extlen, _, vb, body, _, _ = HEADER.unpack_from(view, pos)
            if magic != _REQUEST or end - pos < HEADER_LEN + body:
                return found, seen
            if opcode in opcodes and (not bare or (not extlen and body == keylen)):
                start = pos + HEADER_LEN + extlen
                found.append((vb, bytes(view[start : start + keylen])))
            pos += HEADER_LEN + body
            seen += 1
        if pos != end:
            break
    return found, seen


def rest_of_frame(head: bytes, buffered: int, available: int) -> int | None:
    """How many more bytes complete a frame of which ``buffered`` bytes (starting with
    ``head``, its header when 24 bytes long) are already buffered, when ``available`` bytes
    hold them all; None otherwise (the parser then takes the whole chunk)."""
    if len(head) < HEADER_LEN:
        return None
    need = HEADER_LEN + body_length(head) - buffered
    return need if 0 < need <= available else None


def general_run_end(data: bytes, pos: int) -> int | None:
    """Where the general path's share from ``pos`` ends: the frame there (the fast path
    declined it) and the whole frames after it whose opcodes this module never serves (it
    would decline each in turn: handed over in one go, a run of them costs one call, not
    one per frame); None when the first frame is not whole."""
    end = frame_end(data, pos)
    while end is not None:
        after = frame_end(data, end)
        if after is None or data[end + 1] in _SERVE:  # (byte 1 of a header: the opcode)
            break
        end = after
    return end


def frame_end(data: bytes, pos: int) -> int | None:
    """Where the frame at ``pos`` ends, when it lies wholly in ``data`` (its header is not
    checked: the parser that takes it does that)."""
    if len(data) - pos < HEADER_LEN:
        return None
    end = pos + HEADER_LEN + body_length(data, pos)
    return end if end <= len(data) else None

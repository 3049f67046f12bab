"""Fused parse and decode of DCP Mutations: the consumer's hot path, with no Frame in between.

Theory of operation
-------------------
A DCP stream is nearly all Mutation frames. Parsing each into a :class:`Frame` and then
decoding that into a :class:`Mutation` builds two objects and reads the header twice.
:func:`fields_run` reads header and extras in one ``struct`` unpack and keeps the fields in a
plain tuple (:data:`MutationFields`), for as long as the frames are plain mutations:

* magic 0x80 (no framing extras, so no stream id), opcode DcpMutation, 31 bytes of extras,
  a key of 1..250 bytes, a value within the parser's limit, the whole frame in the chunk.

It stops at the first frame that is anything else and :meth:`FrameParser.feed_runs` hands that
one to the general path as a Frame, so a flex frame, a frame split across chunks or a malformed
mutation gets exactly the message or the error it gets today. Each mutation comes with its size
on the wire (header plus body), what a consumer acknowledges for flow control.

Why a tuple: the client builds its own event from the fields (``client/connection.py``), and
a tuple of ints and ``bytes`` is the cheapest thing to build, to unpack and to keep: the
garbage collector stops tracking it at its first pass, so a full inbox costs the collections
nothing. Keys and values are ``bytes`` sliced from the chunk (one copy each, no memoryview).
:func:`mutation_run` makes :class:`Mutation` messages of the same fields, for callers that
want messages.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from dcpkv.protocol.constants import HEADER_LEN, MAX_KEY_LEN, Magic, Opcode
from dcpkv.protocol.dcp import Mutation
from dcpkv.protocol.frame import HEADER, Frame, FrameParser, chunk_bytes

SizedMutation = tuple[int, Mutation]
# (size on the wire, vbucket, key, value, by_seqno, rev_seqno, flags, expiration, cas,
#  datatype, opaque, lock_time, nmeta, nru)
MutationFields = tuple[int, int, bytes, bytes, int, int, int, int, int, int, int, int, int, int]

_EXTRAS = Mutation.EXTRAS
assert _EXTRAS is not None
_HEAD = struct.Struct(HEADER.format + _EXTRAS.format[1:])  # header and extras in one unpack
_HEAD_LEN = _HEAD.size
_EXTRAS_LEN = _EXTRAS.size
_MAGIC, _OPCODE = int(Magic.ClientRequest), int(Opcode.DcpMutation)
_new = object.__new__
# mutations per run at most: short runs let a consumer apply the first ones sooner, and the
# per-run cost is spread over enough of them
RUN_MAX = 64


def fields_run(buf: memoryview, pos: int, max_value: int) -> tuple[list[MutationFields], int]:
    """The fields of every plain mutation frame lying whole in ``buf`` from ``pos`` up to the
    first other frame, and the position after them. A :data:`RunScanner`."""
    run: list[MutationFields] = []
    append, unpack, end = run.append, _HEAD.unpack_from, len(buf)
    data = chunk_bytes(buf)
    while end - pos >= _HEAD_LEN and len(run) < RUN_MAX:
        (magic, opcode, keylen, extlen, datatype, vbucket, body, opaque, cas,
         seqno, rev, flags, expiry, lock, nmeta, nru) = unpack(buf, pos)  # fmt: skip
        size = HEADER_LEN + body
        value_len = body - _EXTRAS_LEN - keylen
        if (opcode != _OPCODE or magic != _MAGIC or extlen != _EXTRAS_LEN or not keylen
                or keylen > MAX_KEY_LEN or size > end - pos or value_len < 0
                or value_len > max_value):  # fmt: skip
            break
        k = pos + _HEAD_LEN
        v = k + keylen
        pos += size
        append((size, vbucket, data[k:v], data[v:pos], seqno, rev, flags, expiry, cas,
                datatype, opaque, lock, nmeta, nru))  # fmt: skip
    return run, pos


def mutation_run(buf: memoryview, pos: int, max_value: int) -> tuple[list[SizedMutation], int]:
    """:func:`fields_run` as (size, :class:`Mutation`) pairs. A :data:`RunScanner`."""
    run, pos = fields_run(buf, pos, max_value)
    return [(f[0], _mutation(f)) for f in run], pos


def _mutation(f: MutationFields) -> Mutation:
    m = _new(Mutation)  # every field set below, as Mutation.decode does
    (_, m.vbucket, m.key, m.value, m.by_seqno, m.rev_seqno, m.flags, m.expiration, m.cas,
     m.datatype, m.opaque, m.lock_time, m.nmeta, m.nru) = f  # fmt: skip
    m.stream_id = None
    return m


def feed_fields(
    parser: FrameParser, data: bytes | bytearray | memoryview
) -> Iterator[list[MutationFields] | Frame]:
    """``parser.feed(data)`` with plain mutations decoded on the way: runs of their fields as
    lists, every other frame as a Frame, in wire order."""
    return parser.feed_runs(data, fields_run)


def feed_mutations(
    parser: FrameParser, data: bytes | bytearray | memoryview
) -> Iterator[list[SizedMutation] | Frame]:
    """:func:`feed_fields` with (size, :class:`Mutation`) pairs."""
    return parser.feed_runs(data, mutation_run)

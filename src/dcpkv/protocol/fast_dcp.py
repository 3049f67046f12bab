"""Fused parse and decode of DCP Mutations: the consumer's hot path, with no Frame in between.

Theory of operation
-------------------
A DCP stream is nearly all Mutation frames. Parsing each into a :class:`Frame` and then
decoding that into a :class:`Mutation` builds two objects and reads the header twice.
:func:`mutation_run` reads header and extras in one ``struct`` unpack and builds the
:class:`Mutation` straight from the chunk, for as long as the frames are plain mutations:

* magic 0x80 (no framing extras, so no stream id), opcode DcpMutation, 31 bytes of extras,
  a key of 1..250 bytes, a value within the parser's limit, the whole frame in the chunk.

It stops at the first frame that is anything else and :meth:`FrameParser.feed_runs` hands that
one to the general path as a Frame, so a flex frame, a frame split across chunks or a malformed
mutation gets exactly the message or the error it gets today. Each mutation comes with its size
on the wire (header plus body), what a consumer acknowledges for flow control. Keys and values
are memoryview slices of the chunk, as the parser makes them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from dcpkv.protocol.constants import HEADER_LEN, MAX_KEY_LEN, Magic, Opcode
from dcpkv.protocol.dcp import Mutation
from dcpkv.protocol.frame import HEADER, Frame, FrameParser

SizedMutation = tuple[int, Mutation]

_EXTRAS = Mutation.EXTRAS
assert _EXTRAS is not None
_HEAD = struct.Struct(HEADER.format + _EXTRAS.format[1:])  # header and extras in one unpack
_HEAD_LEN = _HEAD.size
_EXTRAS_LEN = _EXTRAS.size
_MAGIC, _OPCODE = int(Magic.ClientRequest), int(Opcode.DcpMutation)
_new = object.__new__
# mutations per run at most: a run is kept alive whole until its caller is done with it, and
# a few hundred thousand live objects (one big chunk) cost more in garbage collection than
# they save; short runs also let a consumer apply the first ones sooner
RUN_MAX = 64


def mutation_run(buf: memoryview, pos: int, max_value: int) -> tuple[list[SizedMutation], int]:
    """(size, mutation) of every plain mutation frame lying whole in ``buf`` from ``pos`` up
    to the first other frame, and the position after them. A :data:`RunScanner`."""
    run: list[SizedMutation] = []
    append, unpack, end, cls = run.append, _HEAD.unpack_from, len(buf), Mutation
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
        m = _new(cls)  # every field set below, as Mutation.decode does
        m.by_seqno, m.rev_seqno, m.flags, m.expiration = seqno, rev, flags, expiry
        m.lock_time, m.nmeta, m.nru = lock, nmeta, nru
        m.opaque, m.cas, m.datatype, m.vbucket, m.stream_id = opaque, cas, datatype, vbucket, None
        m.key, m.value = buf[k:v], buf[v:pos]
        append((size, m))
    return run, pos


def feed_mutations(
    parser: FrameParser, data: bytes | bytearray | memoryview
) -> Iterator[list[SizedMutation] | Frame]:
    """``parser.feed(data)`` with plain mutations decoded on the way: runs of (size, mutation)
    as lists, every other frame as a Frame, in wire order."""
    return parser.feed_runs(data, mutation_run)

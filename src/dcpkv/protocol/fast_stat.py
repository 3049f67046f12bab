"""Runs of Stat answers read straight from the receive buffer, with no Frame per stat.

Theory of operation
-------------------
A Stat group over every vbucket is thousands of frames (``vbucket-seqno`` at 1,024 vbuckets:
4,097), and a Spark query's planning asks for it two or three times a batch. Through the
general path each frame cost the client a :class:`~dcpkv.protocol.frame.Frame`, a failed try
of the mutation fast path and a dispatch: 12 ms of CPU a call. :func:`stat_run` is a
:data:`~dcpkv.protocol.frame.RunScanner` like ``fast_dcp.fields_run``: it takes, for as long as
they come, the frames that are plain successful Stat answers with a name

* magic 0x81 (no framing extras), opcode Stat, status Success, no extras, a key of
  1..250 bytes, the whole frame in the chunk,

as ``(opaque, name, value)`` tuples of bytes, and stops at the first other frame, which the
general path then parses as before: the empty-named Stat that ends an answer, an error
answer, a frame split across reads, anything malformed. A run is a :class:`StatRun`, so the
receiver tells it from a run of mutations.
"""

from __future__ import annotations

from dcpkv.core.status import Status
from dcpkv.protocol.constants import HEADER_LEN, MAX_KEY_LEN, Magic, Opcode
from dcpkv.protocol.frame import HEADER, chunk_bytes

StatFields = tuple[int, bytes, bytes]  # (opaque, name, value)

_MAGIC, _OPCODE, _SUCCESS = int(Magic.ClientResponse), int(Opcode.Stat), int(Status.Success)
# stats per run at most: the receiver hands each run on before reading the next
RUN_MAX = 1024


class StatRun(list[StatFields]):
    """A run of :func:`stat_run`'s stats (a list, told apart from a run of mutations)."""


def stat_run(buf: memoryview, pos: int, max_value: int) -> tuple[StatRun, int]:
    """The stats of the plain Stat answers lying whole in ``buf`` from ``pos`` up to the first
    other frame, and the position after them (module docstring)."""
    run = StatRun()
    append, unpack, end = run.append, HEADER.unpack_from, len(buf)
    data = chunk_bytes(buf)
    while end - pos >= HEADER_LEN and len(run) < RUN_MAX:
        magic, opcode, keylen, extlen, _datatype, status, body, opaque, _cas = unpack(buf, pos)
        size = HEADER_LEN + body
        if (opcode != _OPCODE or magic != _MAGIC or status != _SUCCESS or extlen
                or not keylen or keylen > MAX_KEY_LEN or body < keylen or size > end - pos
                or body - keylen > max_value):  # fmt: skip
            break
        k = pos + HEADER_LEN
        v = k + keylen
        pos += size
        append((opaque, data[k:v], data[v:pos]))
    return run, pos

"""Producer-side DCP flow control: the window of unacknowledged bytes, and how a run is cut.

Theory of operation
-------------------
A consumer that sets ``connection_buffer_size`` N (DcpControl) asks the producer to keep at
most about N bytes unacknowledged: a message is sent only while fewer than N bytes are
unacknowledged, so one message (or a lone live snapshot's marker and item, sent as one run)
may overflow N. Every message but Noop counts, its 24-byte header included; the consumer's
BufferAck releases what it names (never below zero). N = 0 turns flow control off. The
consumer's side of the same rule is :mod:`dcpkv.client.flow_control`.

A producer joins consecutive messages of one stream into a *run* (a backfill batch's items, a
memory snapshot's items: :mod:`dcpkv.dcp.active_stream`), one bytes object for one write. A
run must go out exactly as its messages would one at a time, so a run that may not go out
whole is cut (:func:`split_run`) at the message where the rules stop it: the pump's byte
budget, the window, or a barrier waiting for the exact message that reaches its target. Runs
change the number of writes, never what is sent when.

:class:`FlowWindow` is plain data; the producer's pump reads ``unacked`` into a local once per
call and writes it back, as its loop runs once per message.
"""

from __future__ import annotations

import struct
from collections import deque

from dcpkv.dcp.active_stream import Pending

_HEADER_LEN = 24
_BODY_LEN = struct.Struct(">I").unpack_from
_SEQNO = struct.Struct(">Q").unpack_from
UNLIMITED = 1 << 63  # the limit when flow control is off


class FlowWindow:
    """A connection's flow-control window: ``size`` (``connection_buffer_size``; 0: off) and
    the bytes sent and not yet acknowledged."""

    __slots__ = ("size", "unacked")

    def __init__(self) -> None:
        self.size = 0
        self.unacked = 0

    @property
    def limit(self) -> int:
        """The unacknowledged bytes at which sending stops."""
        return self.size or UNLIMITED

    @property
    def is_open(self) -> bool:
        return self.unacked < self.limit

    def sent(self, nbytes: int) -> None:
        self.unacked += nbytes

    def ack(self, nbytes: int) -> None:
        """A BufferAck of ``nbytes``."""
        self.unacked = max(0, self.unacked - nbytes)


def split_run(run: Pending, pending: deque[Pending], budget: int, room: int, one: bool) -> Pending:
    """The head of a run that may go out now, the rest put back first in ``pending``: messages
    are taken while ``budget`` bytes remain and the flow-control window has ``room`` before each
    (as one message at a time would go), at least one, only one when ``one`` (a barrier waits:
    its echo must follow the exact message that reaches its target). Runs carry no stream id,
    so every message is a plain header (body length at 8, an item's seqno at 24)."""
    data, _, covers, count = run
    off = taken = 0
    while taken < count and (taken == 0 or (off < budget and off < room and not one)):
        last = off
        off += _HEADER_LEN + _BODY_LEN(data, off + 8)[0]
        taken += 1
    seqno = _SEQNO(data, last + _HEADER_LEN)[0]
    if taken < count:
        pending.appendleft((data[off:], run[1], covers, count - taken))
        covers = seqno
    return data[:off], seqno, covers, taken

"""Consumer-side flow control and liveness accounting for one DCP connection.

Theory of operation
-------------------
With ``connection_buffer_size`` N negotiated, the producer stops sending once N bytes are
unacknowledged. The consumer counts what it *received* (every DCP message the producer sends
on the stream, 24-byte header included, except Noop, whose exchange is liveness, not data)
and acknowledges with BufferAck once it has consumed enough: 20% of N or 50 KB, whichever is
smaller. Acknowledging in chunks rather than per message keeps the ack traffic small, while
acking well before N keeps the producer from stalling. Answers to the consumer's own requests
(stream request, GetFailoverLog, Control) are not stream data and are not counted.

Liveness: with ``enable_noop`` and ``set_noop_interval`` T, an idle producer sends a Noop
every T seconds. Any frame proves the connection is alive; two intervals without one mean it
is dead (the producer missed a Noop, or the network did).

Both are plain values: the caller passes the clock (``now``, seconds, monotonic).
"""

from __future__ import annotations

from dcpkv.protocol import dcp
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.frame import Frame

ACK_FRACTION = 0.2
ACK_CAP = 50 * 1024
_PRODUCER_MESSAGES = frozenset({Magic.ClientRequest, Magic.AltClientRequest})


def ack_threshold(buffer_size: int) -> int:
    """Bytes consumed before a BufferAck is due."""
    return max(1, min(int(buffer_size * ACK_FRACTION), ACK_CAP))


def counts_for_flow_control(frame: Frame) -> bool:
    """True for producer-sent DCP messages except Noop: StreamEnd (0x55) to the barrier echo
    (0x66), requests only (see the module docstring)."""
    return (
        frame.magic in _PRODUCER_MESSAGES
        and Opcode.DcpStreamEnd <= frame.opcode <= Opcode.DcpBarrier
        and frame.opcode != Opcode.DcpNoop
    )


class FlowControl:
    """Counts received bytes and says when to send a BufferAck (disabled when size is 0)."""

    __slots__ = ("buffer_size", "threshold", "total_acked", "unacked")

    def __init__(self, buffer_size: int) -> None:
        if buffer_size < 0:
            raise ValueError("buffer size must not be negative")
        self.buffer_size = buffer_size
        self.threshold = ack_threshold(buffer_size) if buffer_size else 0
        self.unacked = 0
        self.total_acked = 0

    @property
    def enabled(self) -> bool:
        return self.buffer_size > 0

    def received(self, frame: Frame) -> bool:
        """Account one received frame; True when it counted."""
        if not self.enabled or not counts_for_flow_control(frame):
            return False
        self.unacked += frame.size
        return True

    def received_bytes(self, nbytes: int) -> None:
        """Account a message the caller already classified as counting."""
        if self.enabled:
            self.unacked += nbytes

    @property
    def ack_due(self) -> bool:
        return self.enabled and self.unacked >= self.threshold

    def take_ack(self, *, opaque: int = 0) -> dcp.BufferAck | None:
        """The BufferAck to send now, if one is due (the count restarts from zero)."""
        if not self.ack_due:
            return None
        nbytes, self.unacked = self.unacked, 0
        self.total_acked += nbytes
        return dcp.BufferAck(opaque=opaque, bytes_acked=nbytes)


class Liveness:
    """Noop liveness: dead after two noop intervals without any frame from the producer."""

    __slots__ = ("interval", "last_heard")

    def __init__(self, interval: float, now: float) -> None:
        if interval <= 0:
            raise ValueError("the noop interval must be positive")
        self.interval = interval
        self.last_heard = now

    def heard(self, now: float) -> None:
        """Any frame arrived (a Noop or anything else)."""
        self.last_heard = max(self.last_heard, now)

    def deadline(self) -> float:
        return self.last_heard + 2 * self.interval

    def is_dead(self, now: float) -> bool:
        return now >= self.deadline()

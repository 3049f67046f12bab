"""The DCP connections of one consumer session: one per node, read as one inbox.

Theory of operation
-------------------
A consumer on a cluster streams each vbucket from its active node, so a session holds one DCP
connection per node it streams from (:class:`DcpLinks`), opened on first use by the opener the
consumer passes in (connect, authenticate, DcpOpen, controls). The connections share

* one opaque sequence, so a stream-request answer names its vbucket whichever node sent it;
* one wake-up event, set by any connection's reader when a message arrives, so the consumer
  waits on every node at once and still takes messages only when the application pulls
  (nothing is read ahead into a queue of our own: flow control keeps pacing each producer to
  the application).

:meth:`DcpLinks.take` hands over what every inbox holds as ``(node, bytes, message)`` and the
nodes whose connection ended (after the messages received before the end): the consumer
resumes those nodes' streams elsewhere while the other connections go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Iterator

from dcpkv.client.connection import Connection
from dcpkv.client.flow_control import FlowControl
from dcpkv.client.settings import Node
from dcpkv.core.deadline import within
from dcpkv.protocol.base import Message

Opener = Callable[[Node, Iterator[int], asyncio.Event], Awaitable[Connection]]
Received = tuple[Node, int, Message]


class DcpLinks:
    """See the module docstring."""

    def __init__(self, opener: Opener, buffer_size: int) -> None:
        self._opener = opener
        self._buffer_size = buffer_size
        self.conns: dict[Node, Connection] = {}
        self.flows: dict[Node, FlowControl] = {}
        self.opaques = itertools.count(1)
        self.wake = asyncio.Event()

    async def get(self, node: Node) -> Connection:
        """The connection to ``node``, opened when there is none."""
        conn = self.conns.get(node)
        if conn is None:
            conn = await self._opener(node, self.opaques, self.wake)
            self.conns[node] = conn
            self.flows[node] = FlowControl(self._buffer_size)
        return conn

    def take(self) -> tuple[list[Received], list[Node]]:
        """Every message waiting, and the nodes whose connection ended (dropped here)."""
        self.wake.clear()  # before reading the inboxes: a message after this sets it again
        received: list[Received] = []
        lost: list[Node] = []
        for node, conn in list(self.conns.items()):
            try:
                received.extend((node, nbytes, msg) for nbytes, msg in conn.take())
            except ConnectionError:
                lost.append(node)
        return received, lost

    async def wait(self, timeout: float | None) -> None:
        """Until a message (or a connection's end) arrives on any node, or ``timeout``."""
        with contextlib.suppress(TimeoutError):
            await within(self.wake.wait(), timeout)

    def ack(self, node: Node, nbytes: int) -> None:
        """``nbytes`` of ``node``'s messages were handed over: BufferAck when due."""
        flow = self.flows.get(node)
        conn = self.conns.get(node)
        if flow is None or conn is None:
            return
        flow.received_bytes(nbytes)
        ack = flow.take_ack()
        if ack is not None and conn.error is None:
            conn.send(ack)

    async def drop(self, node: Node) -> None:
        conn = self.conns.pop(node, None)
        self.flows.pop(node, None)
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        for node in list(self.conns):
            await self.drop(node)

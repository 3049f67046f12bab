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

:meth:`DcpLinks.take` hands over what every inbox holds as ``(node, bytes, message)`` (a run of
plain mutations as one entry, ``connection.py``) and the nodes whose connection ended (after
the messages received before the end): the consumer resumes those nodes' streams elsewhere
while the other connections go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Iterator

from dcpkv.client.connection import Connection
from dcpkv.client.flow_control import FlowControl, ack_threshold
from dcpkv.client.settings import Node
from dcpkv.core.deadline import within
from dcpkv.protocol.base import Message
from dcpkv.protocol.fast_dcp import MutationFields

Opener = Callable[[Node, Iterator[int], asyncio.Event], Awaitable[Connection]]
# (node, flow-control bytes, message), or (node, 0, a run of mutations' fields): connection.py
Received = tuple[Node, int, Message | list[MutationFields]]


class DcpLinks:
    """See the module docstring."""

    def __init__(self, opener: Opener, buffer_size: int) -> None:
        self._opener = opener
        self.buffer_size = buffer_size
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
            self.flows[node] = FlowControl(self.buffer_size)
        return conn

    def same_node(self, node: Node) -> Node:
        """The very object :meth:`take` names ``node`` by (an equal one from a later map
        would cost an equality test per message where an identity test does)."""
        for known in self.conns:
            if known == node:
                return known
        return node

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


class PendingAcks:
    """Bytes of one node's messages handed over but not yet told to :meth:`DcpLinks.ack`.

    The consumer adds every message's bytes here (a run of mutations' bytes at once, once the
    run was handed over) and the links hear of them once per threshold (the flow-control ack
    threshold) and at the end of a batch, instead of once per message: a BufferAck goes out
    at the first message (or run) that crosses the threshold, never for bytes not yet handed
    over. :meth:`flush` before anything that may wait (the next batch, a request).
    """

    __slots__ = ("links", "nbytes", "node", "threshold")

    def __init__(self, links: DcpLinks) -> None:
        self.links = links
        self.node: Node | None = None
        self.nbytes = 0
        self.threshold = ack_threshold(links.buffer_size) if links.buffer_size else 1 << 62

    def add(self, node: Node, nbytes: int) -> None:
        if node is not self.node:
            self.flush()
            self.node = node
        self.nbytes += nbytes
        if self.nbytes >= self.threshold:
            self.flush()

    def flush(self) -> None:
        if self.nbytes and self.node is not None:
            self.links.ack(self.node, self.nbytes)
        self.nbytes = 0

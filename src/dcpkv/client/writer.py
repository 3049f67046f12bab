"""Bulk writes over the blocking client: pipelined Set/Delete windows with retries.

Theory of operation
-------------------
Writes go in *windows*: up to ``window`` operations are sent in one
:meth:`~dcpkv.client.blocking.BlockingKV.pipeline` call, then every answer is read back.
Pipelining is what makes this fast: one round trip per window instead of one per document.

Within a window a key appears at most once (:meth:`KVWriter.write` keeps the last operation
for a key), because a retried operation is sent *after* the others of its window: two
operations on one key in one window could then land in the wrong order.

Answers: Success is done; a Delete of a missing key (KeyEnoent) is done too (the goal, no
document, is reached). A status the error map calls retryable (:func:`dcpkv.core.status.
retryable`: a vbucket moving, a flusher catching up, a key with a pending SyncWrite) is sent
again after a capped exponential backoff, up to ``max_attempts`` rounds.

With ``durability`` (:mod:`dcpkv.client.durability`) every write carries that requirement
(the server answers once the write is committed at that level); the sessions say HELLO with
AltRequestSupport and SyncReplication. SyncWriteAmbiguous is sent again too: Set and Delete
are idempotent, and the operation is the window's last word on its key, so sending it again
reaches the same state. DurabilityInvalidLevel and DurabilityImpossible raise their
:class:`~dcpkv.client.durability.SyncWriteError` at once.

A lost connection (a server restart) reconnects and resends what had no answer (Set and
Delete are idempotent). Anything else is a :class:`KVWriteError` naming the key and the
status.

On a cluster a window is split by node: the writer keeps the cluster map
(:class:`~dcpkv.client.router.Router`, bootstrapped with GetClusterConfig from the first seed
that answers) and one blocking session per node, and sends each operation to its vbucket's
active. NotMyVbucket (its body may carry a newer map), a lost node or a vbucket without an
active (mid-failover) sends the operation round again after the map was read anew.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

from dcpkv.client.blocking import BlockingKV, KVRequest, RequestFailed
from dcpkv.client.durability import DurabilityOption, framing, server_durability, sync_write_error
from dcpkv.client.router import Router
from dcpkv.client.settings import ConnectionSettings, Node
from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status, retryable, status_name
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import HelloFeature, Opcode
from dcpkv.protocol.frame import Frame

DEFAULT_WINDOW = 1024
DEFAULT_TIMEOUT = 30.0
FIRST_BACKOFF = 0.01
MAX_BACKOFF = 1.0
_SET_EXTRAS = struct.Struct(">II")


class KVWriteError(DcpkvError, RuntimeError):
    """A write the server refused for good, or that kept failing past the retry budget."""


@dataclass(frozen=True, slots=True)
class WriteOp:
    """Upsert ``key`` (``delete`` False) with value/flags/expiry, or delete it."""

    key: bytes
    delete: bool = False
    value: bytes = b""
    flags: int = 0
    expiry: int = 0


class KVWriter:
    """Bulk upserts and deletes of :class:`WriteOp`, in pipelined windows routed by the
    cluster map to each vbucket's active node, retried on temporary failures and moves::

        with KVWriter(ConnectionSettings.at(port=11210), num_vbuckets=1024) as writer:
            writer.write(WriteOp(f"doc{i}".encode(), value=b"{}") for i in range(10_000))
            writer.write([WriteOp(b"doc7", delete=True)])

    ``num_vbuckets`` is the bucket's (1024 by default on a server). A write the server
    refuses for good raises :class:`KVWriteError`; the module docstring gives the rules.
    """

    def __init__(
        self,
        settings: ConnectionSettings,
        num_vbuckets: int,
        *,
        window: int = DEFAULT_WINDOW,
        max_attempts: int = 30,
        timeout: float = DEFAULT_TIMEOUT,
        durability: DurabilityOption = None,
    ) -> None:
        self.settings = settings
        self.num_vbuckets = num_vbuckets
        self.window = window
        self.max_attempts = max_attempts
        required = server_durability(durability)
        self.durable = required is not None
        self._framing = framing(required)
        # a durable write's answer comes once it commits: its timeout on top
        self.timeout = timeout + (0 if required is None else required.wait_s)
        self.written = 0
        self.router = Router(settings.nodes, tls=settings.tls is not None)
        self.sessions: dict[Node, BlockingKV] = {}
        self._stale_map = True  # read the map before the first window

    def __enter__(self) -> KVWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for node in list(self.sessions):
            self._drop(node)

    # -- writing ----------------------------------------------------------------------------

    def write(self, ops: Iterable[WriteOp]) -> int:
        """Apply ``ops`` in order (the last operation on a key wins); the number applied."""
        pending: dict[bytes, WriteOp] = {}
        for op in ops:
            # A repeated key closes the window first: its two operations must not share one.
            if op.key in pending or len(pending) >= self.window:
                self._flush(pending)
                pending = {}
            pending[op.key] = op
        self._flush(pending)
        return self.written

    def _flush(self, window: dict[bytes, WriteOp]) -> None:
        todo = list(window.values())
        for attempt in range(self.max_attempts):
            if not todo:
                return
            if attempt:
                time.sleep(min(MAX_BACKOFF, FIRST_BACKOFF * 2**attempt))
            try:
                todo = self._round(todo)
            except OSError:  # no node reachable right now: try again after the pause
                self._stale_map = True
        if todo:
            raise KVWriteError(
                f"{len(todo)} writes still failing after {self.max_attempts} attempts "
                f"(first key {todo[0].key!r})"
            )

    def _round(self, ops: list[WriteOp]) -> list[WriteOp]:
        """Send ``ops`` as one window per node; the ones to retry."""
        if self._stale_map:
            self._refresh_map()
        by_node: dict[Node, list[WriteOp]] = {}
        retry: list[WriteOp] = []  # no active right now: after a map refresh
        for op in ops:
            node = self.router.active(vbucket_for_key(op.key, self.num_vbuckets))
            (retry if node is None else by_node.setdefault(node, [])).append(op)
        for node, group in by_node.items():
            try:
                answers = self._connected(node).pipeline([self._request(op) for op in group])
                if len(answers) != len(group):
                    raise ConnectionResetError("the server closed the connection mid-window")
            except OSError:
                self._drop(node)  # reconnect and resend everything unanswered
                retry.extend(group)
                continue
            retry.extend(self._judge(group, answers))
        self._stale_map = self._stale_map or bool(retry)
        return retry

    def _judge(self, ops: list[WriteOp], answers: list[Frame]) -> list[WriteOp]:
        retry: list[WriteOp] = []
        for op, frame in zip(ops, answers, strict=True):
            if frame.status == Status.Success or (op.delete and frame.status == Status.KeyEnoent):
                self.written += 1
            elif retryable(frame.status) or frame.status == Status.SyncWriteAmbiguous:
                if frame.status == Status.NotMyVbucket:
                    self.router.offer(bytes(frame.value))
                retry.append(op)
            else:
                what = f"write of key {op.key!r}"
                error = sync_write_error(frame.status, what)
                if error is not None:
                    raise error
                raise KVWriteError(f"{what} refused: {status_name(frame.status)}")
        return retry

    def _request(self, op: WriteOp) -> KVRequest:
        vb = vbucket_for_key(op.key, self.num_vbuckets)
        if op.delete:
            return KVRequest(Opcode.Delete, key=op.key, vbucket=vb, framing=self._framing)
        extras = _SET_EXTRAS.pack(op.flags, op.expiry)
        return KVRequest(
            Opcode.Set, key=op.key, value=op.value, extras=extras, vbucket=vb,
            framing=self._framing,
        )  # fmt: skip

    # -- connection -------------------------------------------------------------------------

    def _connected(self, node: Node) -> BlockingKV:
        session = self.sessions.get(node)
        if session is None:
            one = ConnectionSettings((node,), self.settings.bucket, self.settings.user,
                                     self.settings.password, self.settings.tls)  # fmt: skip
            try:
                session = BlockingKV.connect(one, self.timeout)
            except RequestFailed as exc:
                raise KVWriteError(f"login refused: {exc}") from None
            if self.durable:
                try:
                    session.hello(HelloFeature.AltRequestSupport, HelloFeature.SyncReplication)
                except BaseException:
                    session.close()
                    raise
            self.sessions[node] = session
        return session

    def _drop(self, node: Node) -> None:
        session = self.sessions.pop(node, None)
        if session is not None:
            session.close()

    def _refresh_map(self) -> None:
        """Ask every node known for the map, keep the newest; OSError when none answers."""
        error: OSError | None = None
        answered = False
        for node in self.router.candidates():
            try:
                frame = self._connected(node).call(Opcode.GetClusterConfig)
            except OSError as exc:
                self._drop(node)
                error = exc
                continue
            except RequestFailed:  # a server without maps: the first seed takes everything
                answered = True
                continue
            answered = True
            self.router.offer(bytes(frame.value), node)
        if not answered:
            assert error is not None
            raise error
        self._stale_map = False

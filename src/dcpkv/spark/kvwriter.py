"""A small blocking KV writer for the sink: pipelined Set/Delete windows with retries.

Theory of operation
-------------------
One socket, SASL PLAIN and SelectBucket, then writes in *windows*: up to ``window`` operations
are encoded with the codec and sent in one ``sendall`` (opaque = position in the window),
then every answer is read back. Pipelining is what makes this fast: one round trip per
window instead of one per document.

Within a window a key appears at most once (:meth:`KVWriter.write` keeps the last operation
for a key), because a retried operation is sent *after* the others of its window: two
operations on one key in one window could then land in the wrong order.

Answers: Success is done; a Delete of a missing key (KeyEnoent) is done too (the goal, no
document, is reached). NotMyVbucket, Etmpfail, Ebusy and Enomem are transient (a vbucket
moving, a flusher catching up): those operations are sent again after a capped exponential
backoff, up to ``max_attempts`` rounds. A lost connection (a server restart) reconnects and
resends what had no answer (Set and Delete are idempotent). Anything else is a
:class:`KVWriteError` naming the key and the status.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

from dcpkv.core.status import Status, retryable
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.frame import FrameParser, encode_frame

DEFAULT_WINDOW = 1024
FIRST_BACKOFF = 0.01
MAX_BACKOFF = 1.0


class KVWriteError(RuntimeError):
    """A write the server refused for good, or that kept failing past the retry budget."""


@dataclass(frozen=True, slots=True)
class WriteOp:
    """Upsert ``key`` (``delete`` False) with value/flags/expiry, or delete it."""

    key: bytes
    delete: bool = False
    value: bytes = b""
    flags: int = 0
    expiry: int = 0


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    user: str
    password: str
    bucket: str
    timeout: float = 30.0


class KVWriter:
    def __init__(
        self,
        endpoint: Endpoint,
        num_vbuckets: int,
        *,
        window: int = DEFAULT_WINDOW,
        max_attempts: int = 30,
    ) -> None:
        self.endpoint = endpoint
        self.num_vbuckets = num_vbuckets
        self.window = window
        self.max_attempts = max_attempts
        self.written = 0
        self.sock: socket.socket | None = None
        self.parser = FrameParser()

    def __enter__(self) -> KVWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

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
            except OSError:
                self.close()  # reconnect and resend everything unanswered
        if todo:
            raise KVWriteError(
                f"{len(todo)} writes still failing after {self.max_attempts} attempts "
                f"(first key {todo[0].key!r})"
            )

    def _round(self, ops: list[WriteOp]) -> list[WriteOp]:
        """Send ``ops`` pipelined; the ones to retry."""
        sock = self._connected()
        sock.sendall(b"".join(self._encode(i, op) for i, op in enumerate(ops)))
        retry: list[WriteOp] = []
        answered = 0
        while answered < len(ops):
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionResetError("the server closed the connection")
            for frame in self.parser.feed(data):
                op = ops[frame.opaque]
                answered += 1
                if frame.status == Status.Success or (
                    op.delete and frame.status == Status.KeyEnoent
                ):
                    self.written += 1
                elif retryable(frame.status):
                    retry.append(op)
                else:
                    raise KVWriteError(f"write of key {op.key!r} refused: {_status(frame.status)}")
        return retry

    def _encode(self, opaque: int, op: WriteOp) -> bytes:
        vb = vbucket_for_key(op.key, self.num_vbuckets)
        if op.delete:
            return encode_frame(
                Magic.ClientRequest, Opcode.Delete, key=op.key, vbucket=vb, opaque=opaque
            )
        return encode_frame(
            Magic.ClientRequest, Opcode.Set, key=op.key, value=op.value, vbucket=vb,
            extras=struct.pack(">II", op.flags, op.expiry), opaque=opaque,
        )  # fmt: skip

    # -- connection -------------------------------------------------------------------------

    def _connected(self) -> socket.socket:
        if self.sock is None:
            ep = self.endpoint
            sock = socket.create_connection((ep.host, ep.port), timeout=ep.timeout)
            self.parser = FrameParser()
            try:
                auth = f"\0{ep.user}\0{ep.password}".encode()
                self._call(sock, Opcode.SaslAuth, b"PLAIN", auth)
                self._call(sock, Opcode.SelectBucket, ep.bucket.encode(), b"")
            except BaseException:
                sock.close()
                raise
            self.sock = sock
        return self.sock

    def _call(self, sock: socket.socket, opcode: int, key: bytes, value: bytes) -> None:
        sock.sendall(encode_frame(Magic.ClientRequest, opcode, key=key, value=value))
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionResetError("the server closed the connection")
            for frame in self.parser.feed(data):
                if frame.status != Status.Success:
                    raise KVWriteError(f"{Opcode(opcode).name} refused: {_status(frame.status)}")
                return


def _status(status: int) -> str:
    try:
        return Status(status).name
    except ValueError:
        return f"0x{status:02x}"

"""The blocking key-value client, for callers without an event loop, built on the codec alone.

Theory of operation
-------------------
One socket and a :class:`FrameParser`. :meth:`BlockingKV.send` encodes a request with the
next opaque; :meth:`BlockingKV.frames` yields answers as they arrive, detached from the
parser's buffer. Two ways to ask:

* one at a time: :meth:`BlockingKV.call` waits for the frame carrying its opaque and raises
  :class:`RequestFailed` (status and message) unless it is a success; a Stat answer is many
  frames ended by one with an empty key (:meth:`BlockingKV.stats`);
* a *window*: :meth:`BlockingKV.pipeline` sends many requests in one ``sendall`` and reads
  every answer back, in request order, statuses unchecked (the caller decides what to retry).
  One round trip per window instead of one per request is what makes bulk writes fast.

Login (:meth:`BlockingKV.login`) is SCRAM-SHA512 when the server offers it, else PLAIN
(:mod:`dcpkv.client.sasl` does the sans-I/O part), then SelectBucket: the asyncio client's
rule. Used by the commands (``dcpkv stats``), the Spark sink and the loader
(:mod:`dcpkv.client.writer`).
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from dcpkv.client.sasl import SCRAM_MECHANISM, SaslError, ScramClient, plain_payload
from dcpkv.client.settings import ConnectionSettings
from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status, status_name
from dcpkv.core.tls import TlsSettings
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.frame import Frame, FrameParser, encode_frame

READ_CHUNK = 1 << 16


class RequestFailed(DcpkvError):
    """The server answered a request with a non-success status (``status``)."""


@dataclass(frozen=True, slots=True)
class KVRequest:
    """One request of a pipelined window."""

    opcode: int
    key: bytes = b""
    value: bytes = b""
    extras: bytes = b""
    vbucket: int = 0
    cas: int = 0
    framing: bytes = b""  # framing-extras items (a durability requirement): a flex frame


class BlockingKV:
    """A blocking memcached-protocol session with one node: :meth:`call` one request and wait
    for its answer, :meth:`pipeline` a window of requests in one write, :meth:`stats`.
    :meth:`connect` opens one logged in with the bucket selected::

        with BlockingKV.connect(ConnectionSettings.at(port=11210)) as kv:
            print(dict(kv.stats())["curr_items"])

    It speaks to the node it is connected to and does not follow a cluster map: use
    :class:`~dcpkv.client.writer.KVWriter` for routed bulk writes, or
    :class:`~dcpkv.client.cluster.ClusterKV`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = 10.0,
        *,
        max_value_len: int | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        if tls is not None:
            try:
                sock = tls.context().wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.parser = FrameParser() if max_value_len is None else FrameParser(max_value_len)
        self._opaque = 0
        self._pending: deque[Frame] = deque()

    @classmethod
    def connect(cls, settings: ConnectionSettings, timeout: float = 10.0) -> BlockingKV:
        """A session on the first node of ``settings`` that accepts a connection, logged in
        and with the bucket selected (a connection string may name dead nodes too)."""
        error: OSError | None = None
        for node in settings.nodes:
            try:
                session = cls(node.host, node.port, timeout, tls=settings.tls)
            except OSError as exc:
                error = exc
                continue
            try:
                session.login(settings.user, settings.password, settings.bucket)
            except BaseException:
                session.close()
                raise
            return session
        assert error is not None
        raise error

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> BlockingKV:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames -----------------------------------------------------------------------------

    def send(
        self, opcode: int, *, key: bytes = b"", value: bytes = b"", extras: bytes = b"",
        vbucket: int = 0, cas: int = 0,
    ) -> int:  # fmt: skip
        """Send one request with the next opaque; that opaque."""
        self.sock.sendall(self._encode(KVRequest(opcode, key, value, extras, vbucket, cas)))
        return self._opaque

    def _encode(self, req: KVRequest) -> bytes:
        self._opaque = (self._opaque + 1) & 0xFFFFFFFF
        return encode_frame(
            Magic.ClientRequest, req.opcode, key=req.key, value=req.value, extras=req.extras,
            vbucket=req.vbucket, cas=req.cas, opaque=self._opaque, framing_extras=req.framing,
        )  # fmt: skip

    def frames(self) -> Iterator[Frame]:
        while True:
            while self._pending:
                yield self._pending.popleft()
            data = self.sock.recv(READ_CHUNK)
            if not data:
                raise ConnectionResetError("the server closed the connection")
            # Detach from the parser's buffer: frames outlive the next feed.
            for f in self.parser.feed(data):
                f.extras, f.key, f.value = bytes(f.extras), bytes(f.key), bytes(f.value)
                self._pending.append(f)

    def answer(self, opaque: int) -> Frame:
        """The next frame carrying ``opaque`` (others, stale answers, are dropped)."""
        for frame in self.frames():
            if frame.opaque == opaque:
                return frame
        raise AssertionError("unreachable")

    # -- requests ---------------------------------------------------------------------------

    def call(
        self, opcode: int, *, key: bytes = b"", value: bytes = b"", extras: bytes = b"",
        vbucket: int = 0, cas: int = 0,
    ) -> Frame:  # fmt: skip
        """One request and its successful answer (else :class:`RequestFailed`)."""
        opaque = self.send(opcode, key=key, value=value, extras=extras, vbucket=vbucket, cas=cas)
        frame = self.answer(opaque)
        _check(frame)
        return frame

    def pipeline(self, requests: Sequence[KVRequest]) -> list[Frame]:
        """Send ``requests`` in one write; their answers in the same order, unchecked."""
        if not requests:
            return []
        first = self._opaque + 1
        self.sock.sendall(b"".join(self._encode(r) for r in requests))
        answers: list[Frame | None] = [None] * len(requests)
        missing = len(requests)
        for frame in self.frames():
            i = (frame.opaque - first) & 0xFFFFFFFF
            if i < len(answers) and answers[i] is None:
                answers[i] = frame
                missing -= 1
                if not missing:
                    break
        return [a for a in answers if a is not None]

    def login(self, user: str, password: str, bucket: str | None) -> str:
        """SCRAM-SHA512 when offered, else PLAIN; then SelectBucket. The mechanism used."""
        offered = bytes(self.call(Opcode.SaslListMechs).value).decode().split()
        try:
            if SCRAM_MECHANISM in offered:
                self._scram(user, password)
                mechanism = SCRAM_MECHANISM
            else:
                self.call(Opcode.SaslAuth, key=b"PLAIN", value=plain_payload(user, password))
                mechanism = "PLAIN"
        except SaslError as exc:
            raise RequestFailed(str(exc), status=Status.AuthError) from None
        if bucket:
            self.call(Opcode.SelectBucket, key=bucket.encode())
        return mechanism

    def _scram(self, user: str, password: str) -> None:
        scram = ScramClient(user, password)
        mech = SCRAM_MECHANISM.encode()
        first = self.answer(self.send(Opcode.SaslAuth, key=mech, value=scram.first()))
        if first.status != Status.AuthContinue:
            _check(first)
        final = self.call(Opcode.SaslStep, key=mech, value=scram.final(bytes(first.value)))
        scram.verify(bytes(final.value))

    def hello(self, *features: int, agent: str = "dcpkv-blocking") -> set[int]:
        """HELLO with ``features``; those the server acknowledged."""
        value = b"".join(f.to_bytes(2, "big") for f in features)
        answer = self.call(Opcode.Hello, key=agent.encode(), value=value)
        body = bytes(answer.value)
        return {int.from_bytes(body[i : i + 2], "big") for i in range(0, len(body), 2)}

    def stats(self, group: str = "") -> list[tuple[str, str]]:
        opaque = self.send(Opcode.Stat, key=group.encode())
        out: list[tuple[str, str]] = []
        for frame in self.frames():
            if frame.opaque != opaque:
                continue
            _check(frame)
            if not frame.key:
                return out
            out.append((bytes(frame.key).decode(), bytes(frame.value).decode()))
        raise AssertionError("unreachable")


def _check(frame: Frame) -> None:
    if frame.status != Status.Success:
        name = status_name(frame.status)
        message = bytes(frame.value).decode("utf-8", "replace")[:200]
        raise RequestFailed(f"{name}: {message}" if message else name, status=frame.status)

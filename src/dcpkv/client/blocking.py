"""A blocking key-value client for callers without an event loop, built on the codec alone.

Theory of operation
-------------------
One socket, requests sent one at a time, answers read with a :class:`FrameParser` until the
one carrying the request's opaque arrives (a Stat answer is many frames, ended by one with an
empty key). Login is SASL PLAIN, then SelectBucket: enough for admin commands such as
``dcpkv stats``. Errors become :class:`RequestFailed` with the server's status and message.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

from dcpkv.core.status import Status
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.frame import Frame, FrameParser, encode_frame


class RequestFailed(Exception):
    """The server answered a request with a non-success status."""


class BlockingKV:
    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.parser = FrameParser()
        self._opaque = 0
        self._pending: list[Frame] = []

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> BlockingKV:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, opcode: int, *, key: bytes = b"", value: bytes = b"") -> int:
        self._opaque += 1
        frame = encode_frame(Magic.ClientRequest, opcode, key=key, value=value, opaque=self._opaque)
        self.sock.sendall(frame)
        return self._opaque

    def frames(self) -> Iterator[Frame]:
        while True:
            while self._pending:
                yield self._pending.pop(0)
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            # Detach from the parser's buffer: frames outlive the next feed.
            for f in self.parser.feed(data):
                f.extras, f.key, f.value = bytes(f.extras), bytes(f.key), bytes(f.value)
                self._pending.append(f)

    def call(self, opcode: int, *, key: bytes = b"", value: bytes = b"") -> Frame:
        opaque = self.send(opcode, key=key, value=value)
        for frame in self.frames():
            if frame.opaque == opaque:
                _check(frame)
                return frame
        raise AssertionError("unreachable")

    def login(self, user: str, password: str, bucket: str | None) -> None:
        self.call(Opcode.SaslAuth, key=b"PLAIN", value=f"\0{user}\0{password}".encode())
        if bucket:
            self.call(Opcode.SelectBucket, key=bucket.encode())

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
        try:
            name = Status(frame.status).name
        except ValueError:
            name = f"0x{frame.status:02x}"
        message = bytes(frame.value).decode("utf-8", "replace")[:200]
        raise RequestFailed(f"{name}: {message}" if message else name)

"""A tiny blocking test client that speaks the real binary protocol over a socket.

It is deliberately dumb: encode a request with the codec, ``sendall`` it, read frames back with
a :class:`FrameParser`. Tests use it to drive a real server subprocess; it is not a mock.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.frame import Frame, FrameParser, encode_frame


class KVClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.parser = FrameParser(max_value_len=64 * 1024 * 1024)
        self._frames: Iterator[Frame] = iter(())
        self._opaque = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KVClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- raw frames ------------------------------------------------------------------------

    def frame(
        self,
        opcode: int,
        *,
        key: bytes = b"",
        extras: bytes = b"",
        value: bytes = b"",
        vbucket: int = 0,
        cas: int = 0,
        opaque: int | None = None,
        datatype: int = 0,
    ) -> bytes:
        if opaque is None:
            self._opaque += 1
            opaque = self._opaque
        return encode_frame(
            Magic.ClientRequest, opcode, key=key, extras=extras, value=value,
            vbucket=vbucket, cas=cas, opaque=opaque, datatype=datatype,
        )  # fmt: skip

    def send(self, raw: bytes) -> None:
        self.sock.sendall(raw)

    def recv_frame(self) -> Frame:
        while True:
            for frame in self._frames:
                return _own(frame)
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("server closed the connection")
            self._frames = self.parser.feed(data)

    def closed_by_server(self) -> bool:
        """True once the server has closed its end (reads EOF)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def call(self, opcode: int, **kw: object) -> Frame:
        self.send(self.frame(opcode, **kw))  # type: ignore[arg-type]
        return self.recv_frame()

    # -- conveniences ------------------------------------------------------------------------

    def login(self, user: str = "Administrator", password: str = "password") -> Frame:
        value = b"\0" + user.encode() + b"\0" + password.encode()
        return self.call(Opcode.SaslAuth, key=b"PLAIN", value=value)

    def hello(self, *features: int) -> Frame:
        value = b"".join(int(f).to_bytes(2, "big") for f in features)
        return self.call(Opcode.Hello, key=b"kvclient", value=value)

    def set(
        self, key: bytes, value: bytes, *, vbucket: int = 0, cas: int = 0, flags: int = 0,
        expiry: int = 0, opcode: int = Opcode.Set,
    ) -> Frame:  # fmt: skip
        extras = struct.pack(">II", flags, expiry)
        return self.call(opcode, key=key, value=value, extras=extras, vbucket=vbucket, cas=cas)

    def get(self, key: bytes, *, vbucket: int = 0) -> Frame:
        return self.call(Opcode.Get, key=key, vbucket=vbucket)

    def arith(
        self, opcode: int, key: bytes, delta: int, initial: int = 0, expiry: int = 0,
        vbucket: int = 0,
    ) -> Frame:  # fmt: skip
        extras = struct.pack(">QQI", delta, initial, expiry)
        return self.call(opcode, key=key, extras=extras, vbucket=vbucket)

    def stats(self, group: bytes = b"") -> dict[str, str]:
        self.send(self.frame(Opcode.Stat, key=group))
        out: dict[str, str] = {}
        while True:
            frame = self.recv_frame()
            assert frame.status == Status.Success, Status(frame.status)
            if not frame.key:
                return out
            out[bytes(frame.key).decode()] = bytes(frame.value).decode()

    def observe(self, vbucket: int, uuid: int) -> Frame:
        return self.call(Opcode.ObserveSeqno, vbucket=vbucket, value=struct.pack(">Q", uuid))


class Writer:
    """A logged-in :class:`KVClient` that sends every key to its vbucket (``num_vbuckets``: the
    bucket's count; serverproc starts every server with 16)."""

    def __init__(self, port: int, num_vbuckets: int = 16) -> None:
        self.c = KVClient(port)
        self.num_vbuckets = num_vbuckets
        assert self.c.login().status == Status.Success

    def close(self) -> None:
        self.c.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def vb_of(self, key: bytes) -> int:
        return vbucket_for_key(key, self.num_vbuckets)

    def set(self, key: bytes, value: bytes, expiry: int = 0) -> None:
        frame = self.c.set(key, value, vbucket=self.vb_of(key), expiry=expiry)
        assert frame.status == Status.Success

    def delete(self, key: bytes) -> None:
        """Delete ``key``; a key that does not exist is no error."""
        self.c.send(self.c.frame(Opcode.Delete, key=key, vbucket=self.vb_of(key)))
        assert self.c.recv_frame().status in (Status.Success, Status.KeyEnoent)

    def docs(self, keys: set[bytes]) -> dict[bytes, bytes]:
        """The documents of ``keys`` that exist."""
        out = {}
        for key in keys:
            frame = self.c.get(key, vbucket=self.vb_of(key))
            if frame.status == Status.Success:
                out[key] = bytes(frame.value)
            else:
                assert frame.status == Status.KeyEnoent
        return out


def poll_rounds(limit_s: float = 30.0, pause_s: float = 0.002) -> Iterator[int]:
    """Rounds of a polling loop, paced and bounded by time rather than by a count of
    back-to-back requests: a fast loopback answers ~10k polls/s, so a count runs out before one
    slow fsync on a busy machine is done. The bound is a safety net, not an assertion."""
    deadline = time.monotonic() + limit_s
    rounds = 0
    while time.monotonic() < deadline:
        yield rounds
        rounds += 1
        time.sleep(pause_s)


def send_batch(
    c: KVClient, opcode: int, keys: list[bytes], value: bytes = b"", num_vbuckets: int = 16
) -> list[Frame]:
    """Pipelined requests in one send, one per key, each to the key's vbucket (of
    ``num_vbuckets``: serverproc starts every server with 16); the answers, in request order.
    A Set carries zero flags and expiry."""
    extras = struct.pack(">II", 0, 0) if opcode == Opcode.Set else b""
    c.send(b"".join(
        c.frame(opcode, key=k, value=value, extras=extras, vbucket=vbucket_for_key(k, num_vbuckets))
        for k in keys
    ))  # fmt: skip
    return [c.recv_frame() for _ in keys]


def write_keys(
    c: KVClient, keys: list[bytes], value: bytes, *, batch: int, window_s: float
) -> tuple[int, list[bytes]]:
    """Set every key, ``batch`` at a time (pipelined), retrying those answered Etmpfail as a
    client should, for up to ``window_s`` per batch; stops at the first batch still refused
    then. Returns the keys taken and that batch's refused keys (none: every key was taken).
    Any answer but Success or Etmpfail fails the test."""
    taken = 0
    for base in range(0, len(keys), batch):
        pending = keys[base : base + batch]
        for _ in poll_rounds(limit_s=window_s, pause_s=0.02):
            refused = []
            for key, frame in zip(pending, send_batch(c, Opcode.Set, pending, value), strict=True):
                assert frame.status in (Status.Success, Status.Etmpfail), Status(frame.status)
                if frame.status == Status.Etmpfail:
                    refused.append(key)
            taken += len(pending) - len(refused)
            pending = refused
            if not pending:
                break
        if pending:
            return taken, pending
    return taken, []


def _own(frame: Frame) -> Frame:
    """Detach a frame from the parser's buffer (tests keep frames around)."""
    frame.extras, frame.key, frame.value = bytes(frame.extras), bytes(frame.key), bytes(frame.value)
    return frame

"""An independent memcached/DCP client written from the protocol facts alone (PROTOCOL.md and
Couchbase's public protocol documents): plain ``struct`` and ``socket``, and no import of
dcpkv's codec, so a codec bug cannot hide behind the same codec decoding it. Snappy comes
from ``cramjam`` (the format is Snappy's, not ours).

It behaves like Couchbase's own DCP tools: :meth:`RawClient.hello` returns what the server
acknowledged, and :func:`insisting_client` gives up unless all of Xattr, XError, Snappy and
JSON are acknowledged.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import cramjam

HEADER = struct.Struct(">BBHBBHIIQ")
FLEX_HEADER = struct.Struct(">BBBBBBHIIQ")
HELLO, SASL_AUTH, SELECT_BUCKET, NOOP = 0x1F, 0x21, 0x89, 0x0A
DCP_OPEN, DCP_CONTROL, DCP_STREAM_REQ, DCP_CLOSE = 0x50, 0x5E, 0x53, 0x52
DCP_END, DCP_MARKER, DCP_MUTATION, DCP_DELETION, DCP_EXPIRATION = 0x55, 0x56, 0x57, 0x58, 0x59
DCP_NOOP = 0x5C
F_DATATYPE, F_XATTR, F_XERROR, F_SNAPPY, F_JSON = 0x01, 0x06, 0x07, 0x0A, 0x0B
REQUIRED = (F_XATTR, F_XERROR, F_SNAPPY, F_JSON)  # what couchbase-cli's streamer insists on
SNAPPY, XATTR = 0x02, 0x04


@dataclass
class Packet:
    magic: int
    opcode: int
    datatype: int
    status: int  # the vbucket field of a request
    opaque: int
    cas: int
    framing: bytes
    extras: bytes
    key: bytes
    value: bytes


class RawClient:
    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.opaque = 0
        self.backlog: list[Packet] = []  # messages read while waiting for an answer

    def close(self) -> None:
        self.sock.close()

    def send(
        self, opcode: int, key: bytes = b"", value: bytes = b"", extras: bytes = b"", *,
        vbucket: int = 0, cas: int = 0, datatype: int = 0, framing: bytes = b"",
        magic: int = 0x80, opaque: int | None = None,
    ) -> int:  # fmt: skip
        if opaque is None:
            self.opaque += 1
            opaque = self.opaque
        body = len(framing) + len(extras) + len(key) + len(value)
        if framing:
            head = FLEX_HEADER.pack(0x08, opcode, len(framing), len(key), len(extras), datatype,
                                    vbucket, body, opaque, cas)  # fmt: skip
        else:
            head = HEADER.pack(magic, opcode, len(key), len(extras), datatype, vbucket, body,
                               opaque, cas)  # fmt: skip
        self.sock.sendall(head + framing + extras + key + value)
        return opaque

    def recv(self) -> Packet:
        if self.backlog:
            return self.backlog.pop(0)
        return self._read()

    def _read(self) -> Packet:
        while len(self.buf) < 24 or len(self.buf) < 24 + struct.unpack_from(">I", self.buf, 8)[0]:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by the server")
            self.buf += data
        magic = self.buf[0]
        if magic in (0x18, 0x08):
            _, op, flen, klen, elen, dt, st, blen, opq, cas = FLEX_HEADER.unpack_from(self.buf)
        else:
            _, op, klen, elen, dt, st, blen, opq, cas = HEADER.unpack_from(self.buf)
            flen = 0
        body = self.buf[24 : 24 + blen]
        self.buf = self.buf[24 + blen :]
        e0, k0 = flen + elen, flen + elen + klen
        return Packet(magic, op, dt, st, opq, cas, body[:flen], body[flen:e0], body[e0:k0],
                      body[k0:])  # fmt: skip

    def call(self, opcode: int, key: bytes = b"", value: bytes = b"", extras: bytes = b"",
             **kw: int) -> Packet:  # fmt: skip
        self.send(opcode, key, value, extras, **kw)  # type: ignore[arg-type]
        return self.recv()

    def hello(self, *features: int) -> set[int]:
        answer = self.call(
            HELLO, b'{"a":"rawclient"}', b"".join(struct.pack(">H", f) for f in features)
        )
        return {
            struct.unpack_from(">H", answer.value, i)[0] for i in range(0, len(answer.value), 2)
        }

    def login(self, user: str = "Administrator", password: str = "password",
              bucket: str = "default") -> None:  # fmt: skip
        auth = self.call(SASL_AUTH, b"PLAIN", f"\0{user}\0{password}".encode())
        assert auth.status == 0, auth
        assert self.call(SELECT_BUCKET, bucket.encode()).status == 0

    def high_seqno(self, vb: int) -> int:
        """From ``stat vbucket-seqno N`` (an answer per field, then an empty key)."""
        answer = self.call(0x10, b"vbucket-seqno %d" % vb)
        high = 0
        while answer.key:
            if answer.key.endswith(b":high_seqno"):
                high = int(answer.value)
            answer = self.recv()
        return high

    def dcp_open(self, name: str, flags: int) -> None:
        answer = self.call(DCP_OPEN, name.encode(), extras=struct.pack(">II", 0, 1 | flags))
        assert answer.status == 0, answer

    def control(self, key: str, value: str) -> int:
        return self.call(DCP_CONTROL, key.encode(), value.encode()).status

    def stream_request(self, vb: int, end: int = 0xFFFFFFFFFFFFFFFF, *, framing: bytes = b"",
                       opaque: int | None = None) -> Packet:  # fmt: skip
        extras = struct.pack(">IIQQQQQ", 0, 0, 0, end, 0, 0, 0)
        self.send(DCP_STREAM_REQ, extras=extras, vbucket=vb, framing=framing, opaque=opaque)
        return self.recv_answer(DCP_STREAM_REQ)

    def recv_answer(self, opcode: int) -> Packet:
        """The next response to ``opcode``, answering Noops meanwhile (other messages are
        kept for :meth:`recv`)."""
        while True:
            p = self._read()
            if p.magic in (0x81, 0x18) and p.opcode == opcode:
                return p
            if p.opcode == DCP_NOOP:
                self._answer_noop(p)
            else:
                self.backlog.append(p)

    def _answer_noop(self, p: Packet) -> None:
        if p.opcode == DCP_NOOP and p.magic == 0x82:
            self.sock.sendall(HEADER.pack(0x81, DCP_NOOP, 0, 0, 0, 0, 0, p.opaque, 0))

    def stream_until_end(self, count: int = 1) -> list[Packet]:
        """Every DCP message up to ``count`` StreamEnds (Noops answered and left out)."""
        out: list[Packet] = []
        ends = 0
        while ends < count:
            p = self.recv()
            if p.opcode == DCP_NOOP:
                self._answer_noop(p)
                continue
            out.append(p)
            ends += p.opcode == DCP_END
        return out


def split_xattrs(value: bytes) -> tuple[dict[str, str], bytes]:
    """(xattrs, body) of a value with the Xattr datatype bit: u32 total, then u32-prefixed
    ``key NUL value NUL`` pairs, then the body."""
    (total,) = struct.unpack_from(">I", value)
    pos, end, pairs = 4, 4 + total, {}
    while pos < end:
        (n,) = struct.unpack_from(">I", value, pos)
        k, v, _ = value[pos + 4 : pos + 4 + n].split(b"\0")
        pairs[k.decode()] = v.decode()
        pos += 4 + n
    return pairs, value[end:]


def xattr_blob(pairs: dict[str, str]) -> bytes:
    body = b"".join(
        struct.pack(">I", len(k) + len(v) + 2) + k.encode() + b"\0" + v.encode() + b"\0"
        for k, v in pairs.items()
    )
    return struct.pack(">I", len(body)) + body


def inflate(value: bytes) -> bytes:
    return bytes(cramjam.snappy.decompress_raw(value))


def deflate(value: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(value))


@contextmanager
def insisting_client(port: int) -> Iterator[RawClient]:
    """A client that refuses to go on unless the server acknowledged every REQUIRED feature."""
    client = RawClient(port)
    try:
        acked = client.hello(F_DATATYPE, *REQUIRED)
        missing = set(REQUIRED) - acked
        if missing:
            raise RuntimeError(f"server did not acknowledge {sorted(missing)}")
        client.login()
        yield client
    finally:
        client.close()

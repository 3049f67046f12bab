"""A blocking DCP consumer made of nothing but a socket and the codec.

It logs in (SASL PLAIN), selects the bucket, opens a producer connection and then keeps, per
vbucket, what a real consumer keeps: the documents, the last seqno, the last snapshot marker,
every complete snapshot's end (its consistent points) and the failover log. It also keeps
every version it received, so it can roll back to any seqno as spec 000 asks (drop what is
above the point, resume with the snapshot that ends there).

Everything that arrives is decoded with ``decode_message`` and applied in order; requests
sent while streams are flowing (stream requests, controls) wait for their own answer by
opaque, applying whatever DCP messages come first. Every read is bounded by the socket
timeout, and every loop by a message count, so a broken server fails a test instead of
hanging it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.seqno import U64_MAX
from dcpkv.core.status import Status
from dcpkv.protocol import dcp, kv
from dcpkv.protocol.base import GenericResponse, Message, Response
from dcpkv.protocol.constants import Magic, Opcode, OpenFlag
from dcpkv.protocol.frame import FrameParser, encode_frame
from dcpkv.protocol.messages import decode_message

MAX_MESSAGES = 500_000


@dataclass
class VbState:
    """What the consumer holds for one vbucket."""

    docs: dict[bytes, bytes] = field(default_factory=dict)
    seqno: int = 0
    snapshot: tuple[int, int] = (0, 0)
    consistent: list[int] = field(default_factory=lambda: [0])  # complete snapshots' ends
    versions: list[tuple[int, bytes, bytes | None]] = field(default_factory=list)
    failover: tuple[FailoverEntry, ...] = ()
    ended: int | None = None  # the StreamEnd reason, once it came
    markers: list[dcp.SnapshotMarker] = field(default_factory=list)
    items: list[Message] = field(default_factory=list)

    @property
    def uuid(self) -> int:
        return self.failover[0].uuid if self.failover else 0

    def apply_item(self, seqno: int, key: bytes, value: bytes | None) -> None:
        start, end = self.snapshot
        assert self.seqno < seqno and start <= seqno <= end, (self.seqno, seqno, start, end)
        self.seqno = seqno
        self.versions.append((seqno, key, value))
        if value is None:
            self.docs.pop(key, None)
        else:
            self.docs[key] = value
        if seqno == end:
            self.consistent.append(end)

    def rollback(self, point: int) -> int:
        """Keep only what is at or below the last consistent point <= ``point``; returns it."""
        keep = max(c for c in self.consistent if c <= point)
        self.versions = [v for v in self.versions if v[0] <= keep]
        self.consistent = [c for c in self.consistent if c <= keep]
        self.docs = {}
        for _, key, value in self.versions:
            if value is None:
                self.docs.pop(key, None)
            else:
                self.docs[key] = value
        self.seqno, self.snapshot, self.ended = keep, (keep, keep), None
        return keep


class DcpClient:
    def __init__(
        self,
        port: int,
        name: str = "test:consumer",
        *,
        flags: int = OpenFlag.Producer,
        bucket: str = "default",
        user: str = "Administrator",
        password: str = "password",
        timeout: float = 10.0,
        open_: bool = True,
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.parser = FrameParser(max_value_len=64 * 1024 * 1024)
        self.vbs: dict[int, VbState] = {}
        self.opaque = 0x100
        self.answer_noops = True
        self.noops = 0
        self.barriers: list[bytes] = []
        self.log: list[Message] = []  # every server-initiated message, in order
        self.dcp_bytes = 0  # bytes of flow-controlled DCP messages received
        self._waiting: dict[int, Message] = {}
        self._frames: list[Message] = []
        self.closed = False
        self.check(self.call_raw(Opcode.SaslAuth, key=b"PLAIN",
                                 value=f"\0{user}\0{password}".encode()))  # fmt: skip
        self.check(self.call_raw(Opcode.SelectBucket, key=bucket.encode()))
        if open_:
            self.check(self.call(dcp.DcpOpen(name=name, flags=flags)))

    def close(self) -> None:
        self.sock.close()

    # -- requests ----------------------------------------------------------------------------

    def next_opaque(self) -> int:
        self.opaque += 1
        return self.opaque

    def send(self, msg: Message) -> None:
        self.sock.sendall(msg.encode())

    def call(self, msg: Message) -> Message:
        """Send a request and wait for its answer, applying the DCP traffic that comes first."""
        msg.opaque = self.next_opaque()
        self.send(msg)
        return self.wait_answer(msg.opaque)

    def call_raw(self, opcode: int, *, key: bytes = b"", value: bytes = b"",
                 extras: bytes = b"", vbucket: int = 0) -> Message:  # fmt: skip
        opaque = self.next_opaque()
        self.sock.sendall(encode_frame(Magic.ClientRequest, opcode, key=key, value=value,
                                       extras=extras, vbucket=vbucket, opaque=opaque))  # fmt: skip
        return self.wait_answer(opaque)

    def wait_answer(self, opaque: int) -> Message:
        for _ in range(MAX_MESSAGES):
            if opaque in self._waiting:
                return self._waiting.pop(opaque)
            self.pump_one()
        raise AssertionError("no answer")

    @staticmethod
    def check(answer: Message) -> Message:
        status = getattr(answer, "status", Status.Success)
        assert status == Status.Success, (Status(status), answer)
        return answer

    def control(self, key: str, value: str) -> int:
        answer = self.call(dcp.DcpControl(key=key, value=value))
        return int(getattr(answer, "status", Status.Success))

    def stream(
        self, vb: int, *, start: int | None = None, end: int = U64_MAX, uuid: int | None = None,
        snapshot: tuple[int, int] | None = None, flags: int = 0,
    ) -> Message:  # fmt: skip
        """Request a stream; by default resume from what this consumer holds for ``vb``."""
        st = self.vbs.setdefault(vb, VbState())
        start = st.seqno if start is None else start
        snap_start, snap_end = snapshot if snapshot is not None else st.snapshot
        if snapshot is None and start in st.consistent:
            snap_start = snap_end = start
        answer = self.call(dcp.StreamRequest(
            vbucket=vb, flags=flags, start_seqno=start, end_seqno=end,
            vbucket_uuid=st.uuid if uuid is None else uuid,
            snap_start_seqno=snap_start, snap_end_seqno=snap_end,
        ))  # fmt: skip
        if isinstance(answer, dcp.StreamRequestOk):
            st.failover, st.ended = answer.failover_log, None
        return answer

    def stream_with_rollback(self, vb: int, max_rollbacks: int = 5) -> list[int]:
        """Stream ``vb`` from what we hold, rolling back as told (spec 000, consumer side)."""
        points: list[int] = []
        for _ in range(max_rollbacks):
            answer = self.stream(vb)
            if isinstance(answer, dcp.StreamRequestOk):
                return points
            assert isinstance(answer, dcp.StreamRequestRollback), answer
            points.append(answer.rollback_seqno)
            st = self.vbs[vb]
            kept = st.rollback(answer.rollback_seqno)
            log = self.call(dcp.GetFailoverLog(vbucket=vb))
            assert isinstance(log, dcp.GetFailoverLogResponse)
            # Our history is the producer's now: the branch that holds what we kept.
            st.failover = tuple(e for e in log.failover_log if e.seqno <= kept)
        raise AssertionError(f"still told to roll back after {points}")

    # -- receiving -------------------------------------------------------------------------

    def _read(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            self.closed = True
            raise ConnectionError("server closed the connection")
        for frame in self.parser.feed(data):
            msg = decode_message(frame)
            pushed = frame.magic in (Magic.ClientRequest, Magic.ServerRequest)
            if pushed and frame.opcode != Opcode.DcpNoop:
                self.dcp_bytes += frame.size
            self._frames.append(msg)

    def pump_one(self) -> Message:
        """Read and apply one message."""
        while not self._frames:
            self._read()
        msg = self._frames.pop(0)
        self._apply(msg)
        return msg

    def _apply(self, msg: Message) -> None:
        if isinstance(msg, Response):
            self._waiting[msg.opaque] = msg
            return
        self.log.append(msg)
        vb = getattr(msg, "vbucket", 0)
        st = self.vbs.setdefault(vb, VbState())
        if isinstance(msg, dcp.SnapshotMarker):
            st.snapshot = (msg.start_seqno, msg.end_seqno)
            st.markers.append(msg)
        elif isinstance(msg, dcp.Mutation):
            st.items.append(msg)
            st.apply_item(msg.by_seqno, bytes(msg.key), bytes(msg.value))
        elif isinstance(msg, dcp.Deletion | dcp.DeletionV2 | dcp.Expiration):
            st.items.append(msg)
            st.apply_item(msg.by_seqno, bytes(msg.key), None)
        elif isinstance(msg, dcp.StreamEnd):
            st.ended = int(msg.reason)
        elif isinstance(msg, dcp.DcpNoop):
            self.noops += 1
            if self.answer_noops:
                self.send(GenericResponse(opcode=Opcode.DcpNoop, opaque=msg.opaque))
        elif isinstance(msg, dcp.DcpBarrier):
            self.barriers.append(bytes(msg.cookie))

    def follow(self, done: Callable[[], bool], max_messages: int = MAX_MESSAGES) -> None:
        for _ in range(max_messages):
            if done():
                return
            self.pump_one()
        raise AssertionError("condition never met")

    def follow_to(self, seqnos: dict[int, int]) -> None:
        """Read until every vbucket in ``seqnos`` has reached its seqno."""
        self.follow(lambda: all(self.vbs.get(vb, VbState()).seqno >= s for vb, s in seqnos.items()))

    def docs(self) -> dict[bytes, bytes]:
        return {k: v for st in self.vbs.values() for k, v in st.docs.items()}


def all_vb_seqnos(client: DcpClient) -> dict[int, int]:
    answer = client.check(client.call_raw(Opcode.GetAllVbSeqnos))
    assert isinstance(answer, kv.GetAllVbSeqnosResponse)
    return dict(answer.seqnos)

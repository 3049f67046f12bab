"""One asyncio connection to the data server: requests by opaque, pushed messages in order.

Theory of operation
-------------------
A reader task owns the socket's read side. Every frame it parses goes one of three ways:

* a response whose opaque a caller is waiting for (:meth:`Connection.call`, :meth:`stats`)
  resolves that caller's future (a Stat answer is many frames, ended by an empty name);
* a DCP Noop from the producer is answered at once, by the reader itself, so a slow
  application never makes the producer think the connection died;
* anything else (DCP messages, and the answers to stream requests, which must stay in order
  with the stream's first messages) is decoded and appended to the *inbox*, with its size when
  it counts for flow control. :meth:`next_batch` hands the inbox over. Mutations, nearly all
  of a stream, skip the dispatch: decoded straight from the read buffer (``protocol.fast_dcp``,
  no Frame in between) into runs of field tuples, one inbox entry ``(0, run)`` per run (each
  tuple carries its own flow-control size), one wake-up per read. Tuples of ints and bytes are
  dropped by the garbage collector's tracking at its first pass, so a full inbox does not make
  every collection longer (events are built from them as the application pulls).

Liveness: with a :class:`Liveness`, each read waits at most until its deadline (two noop
intervals after the last frame); a silent producer ends the connection with
:class:`DeadConnectionError`. Any error ends the reader: waiting callers get it at once, the
inbox consumer after the messages that arrived before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from dcpkv.client.flow_control import Liveness, counts_for_flow_control
from dcpkv.client.sasl import SCRAM_MECHANISM, SaslError, ScramClient, plain_payload
from dcpkv.core.deadline import within
from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status, status_name
from dcpkv.core.tls import TlsSettings
from dcpkv.protocol import dcp, kv
from dcpkv.protocol.base import GenericResponse, Message, Request
from dcpkv.protocol.constants import HEADER_LEN, Magic, Opcode
from dcpkv.protocol.fast_dcp import MutationFields, fields_run
from dcpkv.protocol.fast_stat import StatRun, stat_run
from dcpkv.protocol.frame import Frame, FrameParser, with_framing
from dcpkv.protocol.messages import decode_message

READ_CHUNK = 1 << 20
MAX_VALUE_LEN = 64 * 1024 * 1024
_MUTATION, _REQUEST, _HEADER = int(Opcode.DcpMutation), int(Magic.ClientRequest), HEADER_LEN
_decode_mutation = dcp.Mutation.decode
_RESPONSES = frozenset({Magic.ClientResponse, Magic.AltClientResponse, Magic.ServerResponse})


def _scan(buf: memoryview, pos: int, max_value: int) -> tuple[list[Any], int]:
    """The receiver's fast paths (a :data:`~dcpkv.protocol.frame.RunScanner`): a run of DCP
    mutations (nearly all of a stream), else a run of Stat answers (a group over every
    vbucket is thousands of frames), else nothing: the frame goes the general way."""
    run, end = fields_run(buf, pos, max_value)
    if run:
        return run, end
    return stat_run(buf, pos, max_value)


# An inbox entry: a message with the bytes it counts for flow control, or (0, a run of plain
# mutations' fields), each with its own size (the module docstring).
Pushed = tuple[int, Message | list[MutationFields]]


class ClientError(DcpkvError):
    """The server refused a request (``status``), or the connection broke."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AuthError(ClientError):
    """Authentication or bucket selection failed: retrying will not help."""


class DeadConnectionError(DcpkvError, ConnectionError):
    """Two noop intervals without a frame from the producer."""


class Connection:
    """See the module docstring."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        opaques: Iterator[int] | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._parser = FrameParser(max_value_len=MAX_VALUE_LEN)
        # Connections of one consumer share the opaque sequence (their answers are routed by
        # opaque alone) and the wake-up event (one wait covers every node's inbox).
        self._opaques = opaques if opaques is not None else itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Message]] = {}
        self._stats: dict[int, tuple[list[tuple[str, str]], asyncio.Future[Message]]] = {}
        self._quiet: dict[int, dict[int, Message]] = {}  # call_quiet: opaque -> its failures
        self._inbox: deque[Pushed] = deque()
        self._wake = wake if wake is not None else asyncio.Event()
        self._error: BaseException | None = None
        self.liveness: Liveness | None = None
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        timeout: float,
        tls: TlsSettings | None = None,
        *,
        opaques: Iterator[int] | None = None,
        wake: asyncio.Event | None = None,
    ) -> Connection:
        """Connect (with TLS when ``tls`` is given: the certificate must name ``host``)."""
        ssl = tls.context() if tls is not None else None
        reader, writer = await within(
            asyncio.open_connection(host, port, limit=READ_CHUNK, ssl=ssl), timeout
        )
        return cls(reader, writer, opaques=opaques, wake=wake)

    @property
    def error(self) -> BaseException | None:
        return self._error

    def next_opaque(self) -> int:
        return next(self._opaques)

    def next_opaques(self, count: int) -> list[int]:
        """The next ``count`` opaques at once (a batch of quiet requests)."""
        return list(itertools.islice(self._opaques, count))

    # -- writing --------------------------------------------------------------------------

    def send(self, msg: Message, framing: bytes = b"") -> None:
        """Send ``msg``; with ``framing`` (framing-extras items: a durability requirement) as
        a flex request frame."""
        if self._error is not None:
            raise ConnectionError(f"connection lost: {self._error}")
        data = msg.encode()
        self._writer.write(with_framing(data, framing) if framing else data)

    async def call(self, msg: Request, framing: bytes = b"") -> Message:
        """Send ``msg`` (with ``framing``: :meth:`send`) with a fresh opaque and wait for its
        answer (any status)."""
        msg.opaque = self.next_opaque()
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[msg.opaque] = future
        try:
            self.send(msg, framing)
            return await future
        finally:
            self._waiting.pop(msg.opaque, None)

    async def call_many(self, msgs: list[Request]) -> list[Message]:
        """Send every message of ``msgs`` in one write (fresh opaques) and wait for all their
        answers (any status), in order: a pipelined batch costs one syscall, not one each."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Message]] = []
        for msg in msgs:
            msg.opaque = self.next_opaque()
            future: asyncio.Future[Message] = loop.create_future()
            self._waiting[msg.opaque] = future
            futures.append(future)
        try:
            if self._error is not None:
                raise ConnectionError(f"connection lost: {self._error}")
            self._writer.write(b"".join([msg.encode() for msg in msgs]))
            return list(await asyncio.gather(*futures))
        finally:
            for msg in msgs:
                self._waiting.pop(msg.opaque, None)

    async def call_quiet(self, frames: bytes, opaques: Iterable[int]) -> dict[int, Message]:
        """Send ``frames``: quiet requests (answered only when they fail) stamped with
        ``opaques``, then a Noop. The server answers a connection's requests in order, so
        the Noop's answer means it is done with all of them: the failures' answers, by
        opaque (none: every request succeeded). A batch of N writes costs one answer, not N."""
        failures: dict[int, Message] = {}
        quiet = self._quiet
        mine = list(opaques)
        for opaque in mine:
            quiet[opaque] = failures
        noop = kv.Noop(opaque=self.next_opaque())
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[noop.opaque] = future
        try:
            if self._error is not None:
                raise ConnectionError(f"connection lost: {self._error}")
            self._writer.write(frames + noop.encode())
            await future
            return failures
        finally:
            self._waiting.pop(noop.opaque, None)
            for opaque in mine:
                quiet.pop(opaque, None)

    async def call_ok(self, msg: Request) -> Message:
        answer = await self.call(msg)
        status = getattr(answer, "status", Status.Success)
        if status not in (Status.Success, Status.AuthContinue):
            raise ClientError(f"{type(msg).__name__}: {_describe(answer)}", status)
        return answer

    async def stats(self, group: str = "") -> list[tuple[str, str]]:
        msg = kv.Stat(group=group, opaque=self.next_opaque())
        rows: list[tuple[str, str]] = []
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._stats[msg.opaque] = (rows, future)
        try:
            self.send(msg)
            last = await future
        finally:
            self._stats.pop(msg.opaque, None)
        if getattr(last, "status", Status.Success) != Status.Success:
            raise ClientError(f"Stat {group!r}: {_describe(last)}", getattr(last, "status", None))
        return rows

    async def drain(self) -> None:
        await self._writer.drain()

    async def close(self) -> None:
        self._task.cancel()
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):  # already gone: nothing to flush
            await self._writer.wait_closed()
        # The reader's fate is already recorded in self._error.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    # -- the inbox --------------------------------------------------------------------------

    async def next_batch(self, timeout: float | None = None) -> list[Pushed]:
        """Pushed messages as ``(flow-control bytes, message)``, runs of mutations as ``(0,
        fields)`` (module docstring); [] after ``timeout``. Raises
        the connection's error once everything received before it was handed over."""
        if not self._inbox:
            if self._error is not None:
                raise ConnectionError(f"connection lost: {self._error}") from self._error
            self._wake.clear()
            try:
                await within(self._wake.wait(), timeout)
            except TimeoutError:
                return []
        return self.take()

    def take(self) -> list[Pushed]:
        """What the inbox holds now, without waiting (the caller waits on the shared wake
        event). Raises the connection's error once the inbox is empty."""
        batch = list(self._inbox)
        self._inbox.clear()
        if not batch and self._error is not None:
            raise ConnectionError(f"connection lost: {self._error}") from self._error
        return batch

    # -- the reader -------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                timeout = None
                if self.liveness is not None:
                    timeout = max(0.0, self.liveness.deadline() - loop.time())
                try:
                    data = await within(self._reader.read(READ_CHUNK), timeout)
                except TimeoutError:
                    raise DeadConnectionError("no frame for two noop intervals") from None
                if not data:
                    raise ConnectionError("the server closed the connection")
                if self.liveness is not None:
                    self.liveness.heard(loop.time())
                self._receive(data)
        except asyncio.CancelledError:
            self._fail(ConnectionError("connection closed"))
            raise
        except Exception as exc:
            self._fail(exc)

    def _receive(self, data: bytes) -> None:
        """Every frame of ``data``: mutations (nearly all of a stream) decoded straight into
        the inbox, anything else through :meth:`_dispatch`; one wake-up for the lot."""
        inbox = self._inbox
        before = len(inbox)
        append, mutation = inbox.append, _decode_mutation
        for item in self._parser.feed_runs(data, _scan):
            if type(item) is StatRun:
                self._stat_rows(item)
                continue
            if isinstance(item, list):
                append((0, item))  # plain mutations' fields, each with its size, no Frame
                continue
            frame = item
            if frame.opcode == _MUTATION and frame.magic == _REQUEST:
                # one the fused path left: split across reads, or malformed (decode raises);
                # counts for flow control (a producer's DCP message): header plus body
                size = _HEADER + len(frame.extras) + len(frame.key) + len(frame.value)
                append((size, mutation(frame)))
            else:
                self._dispatch(frame)
        if len(inbox) != before:
            self._wake.set()

    def _dispatch(self, frame: Frame) -> None:
        if frame.magic in _RESPONSES:
            if self._answer(frame):
                return
        elif frame.opcode == Opcode.DcpNoop:
            self._writer.write(GenericResponse(opcode=Opcode.DcpNoop, opaque=frame.opaque).encode())
            return
        size = frame.size if counts_for_flow_control(frame) else 0
        self._inbox.append((size, decode_message(frame)))

    def _stat_rows(self, run: StatRun) -> None:
        """A run of plain Stat answers (``protocol/fast_stat.py``): the rows of the Stat calls
        they answer; those of an opaque nobody asked with are dropped, as :meth:`_answer`
        drops an unasked answer."""
        stats = self._stats
        for opaque, name, value in run:
            stat = stats.get(opaque)
            if stat is not None:
                stat[0].append((name.decode(), value.decode()))

    def _answer(self, frame: Frame) -> bool:
        stat = self._stats.get(frame.opaque)
        if stat is not None:
            rows, future = stat
            if frame.status == Status.Success and frame.key:
                rows.append((bytes(frame.key).decode(), bytes(frame.value).decode()))
            elif not future.done():
                future.set_result(decode_message(frame))
            return True
        waiter = self._waiting.get(frame.opaque)
        if waiter is None:
            failures = self._quiet.get(frame.opaque)
            if failures is None:
                return False
            failures[frame.opaque] = decode_message(frame)
            return True
        if not waiter.done():
            waiter.set_result(decode_message(frame))
        return True

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        for future in [*self._waiting.values(), *(f for _, f in self._stats.values())]:
            if not future.done():
                future.set_exception(ConnectionError(f"connection lost: {exc}"))
        self._wake.set()


def _describe(answer: Message) -> str:
    status = getattr(answer, "status", Status.Success)
    text = bytes(getattr(answer, "value", b"") or b"")[:200].decode("utf-8", "replace")
    return f"{status_name(status)}{': ' + text if text else ''}"


async def authenticate(conn: Connection, user: str, password: str, bucket: str | None) -> str:
    """SCRAM-SHA512 when the server offers it, else PLAIN; then SelectBucket. The mechanism."""
    mechs = await conn.call(kv.SaslListMechs())
    offered = getattr(mechs, "mechanisms", "").split()
    try:
        if SCRAM_MECHANISM in offered:
            await _scram(conn, user, password)
            mechanism = SCRAM_MECHANISM
        else:
            await conn.call_ok(kv.SaslAuth(mechanism="PLAIN", data=plain_payload(user, password)))
            mechanism = "PLAIN"
        if bucket:
            await conn.call_ok(kv.SelectBucket(bucket=bucket))
    except ClientError as exc:
        raise AuthError(str(exc), exc.status) from None
    except SaslError as exc:
        raise AuthError(str(exc)) from None
    return mechanism


async def _scram(conn: Connection, user: str, password: str) -> None:
    scram = ScramClient(user, password)
    first = await conn.call_ok(kv.SaslAuth(mechanism=SCRAM_MECHANISM, data=scram.first()))
    final = scram.final(bytes(getattr(first, "data", b"")))
    last = await conn.call_ok(kv.SaslStep(mechanism=SCRAM_MECHANISM, data=final))
    scram.verify(bytes(getattr(last, "data", b"")))

"""One client connection's protocol logic: frames in, response bytes out (no sockets).

Theory of operation
-------------------
The asyncio shell (:mod:`dcpkv.server.app`) feeds every frame it parses to
:meth:`Connection.handle` and writes what comes back, in order, so pipelined requests are
answered in the order they arrived (the SDKs rely on it). Quiet opcodes return nothing on
success. Handlers raise :class:`Reply` to answer with an error status; anything else that
escapes a handler is a bug, answered with Einternal without taking the server down.

A connection moves through three gates before it may touch data: Hello (optional, negotiates
features), SASL (PLAIN or SCRAM), SelectBucket. Opcodes that need a gate closed answer Eaccess
(not authenticated) or NoBucket (no bucket selected). Key-value and DCP handlers live in their
own modules and register themselves in ``HANDLERS``.

Responses *from* the client (a DCP consumer answering the producer's Noop or
SetVbucketState) go to ``RESPONSE_HANDLERS`` by opcode, but only on a connection that opened
as a DCP producer; on any other connection they are answered UnknownCommand as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dcpkv import __version__
from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status
from dcpkv.protocol.constants import HelloFeature, Magic, Opcode
from dcpkv.protocol.frame import Frame, encode_frame
from dcpkv.server.auth import AuthFailed, SaslSession
from dcpkv.server.cluster_map import cluster_map_json
from dcpkv.server.error_map import error_map_json

if TYPE_CHECKING:
    from dcpkv.server.state import ServerState

# Features this server implements and so acknowledges in Hello.
SUPPORTED_FEATURES = frozenset(
    {
        HelloFeature.Datatype,
        HelloFeature.TcpNoDelay,
        HelloFeature.MutationSeqno,
        HelloFeature.Xerror,
        HelloFeature.SelectBucket,
        HelloFeature.JSON,
        HelloFeature.AltRequestSupport,
    }
)


class Reply(DcpkvError):
    """Answer the current request with ``status`` (and an optional value) and go on."""

    status: Status

    def __init__(self, status: Status, value: bytes = b"") -> None:
        super().__init__(status.name)
        self.status = status
        self.value = value


class CloseConnection(DcpkvError):
    """Stop reading this connection after writing what is queued (Quit, fatal errors)."""


def response(
    frame: Frame,
    status: Status = Status.Success,
    *,
    key: bytes = b"",
    extras: bytes = b"",
    value: bytes = b"",
    cas: int = 0,
    datatype: int = 0,
) -> bytes:
    """A response to ``frame``: same opcode and opaque."""
    return encode_frame(
        Magic.ClientResponse if frame.magic != Magic.ServerRequest else Magic.ServerResponse,
        frame.opcode,
        key=key,
        extras=extras,
        value=value,
        status=status,
        opaque=frame.opaque,
        cas=cas,
        datatype=datatype,
    )


Handler = Callable[["Connection", Frame], bytes | None]
# opcode -> (handler, needs authentication, needs a selected bucket)
HANDLERS: dict[int, tuple[Handler, bool, bool]] = {}
# opcode -> handler of a client's *response* on a DCP connection (see the module docstring)
RESPONSE_HANDLERS: dict[int, Handler] = {}


def _nothing() -> None:
    return None


def handler(
    *opcodes: Opcode, auth: bool = True, bucket: bool = True
) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op in opcodes:
            HANDLERS[op] = (fn, auth, bucket)
        return fn

    return register


@dataclass
class Connection:
    server: ServerState
    peer: str = "?"
    features: set[HelloFeature] = field(default_factory=set)
    user: str | None = None
    bucket_name: str | None = None
    sasl: SaslSession | None = None
    agent: str = ""
    # DCP state, set by Open (see dcpkv.server.dcp_handlers)
    dcp: Any = None
    # Bucket selected on login when the client never sends SelectBucket (plain memcached
    # clients); a bucket named like the user wins, as in Couchbase.
    initial_bucket: str | None = None
    # Closes this connection from outside it (a second DCP Open with the same name); the
    # shell replaces it with one that closes the transport.
    kick: Callable[[], None] = _nothing

    def authenticated(self, user: str | None) -> None:
        self.user = user
        if user is None or self.bucket_name is not None:
            return
        for name in (user, self.initial_bucket):
            if name is not None and name in self.server.buckets:
                self.bucket_name = name
                return

    @property
    def bucket(self) -> Any:
        return self.server.buckets[self.bucket_name] if self.bucket_name else None

    def handle(self, frame: Frame) -> bytes | None:
        if not frame.is_request and self.dcp is not None:
            on_response = RESPONSE_HANDLERS.get(frame.opcode)
            if on_response is not None:
                return on_response(self, frame)
        entry = HANDLERS.get(frame.opcode)
        if entry is None or not frame.is_request:
            return response(frame, Status.UnknownCommand)
        fn, needs_auth, needs_bucket = entry
        if needs_auth and self.user is None:
            return response(frame, Status.Eaccess)
        if needs_bucket and self.bucket_name is None:
            return response(frame, Status.NoBucket)
        try:
            return fn(self, frame)
        except Reply as reply:
            return response(frame, reply.status, value=reply.value)


# -- session opcodes -------------------------------------------------------------------------


@handler(Opcode.Noop, auth=False, bucket=False)
def _noop(conn: Connection, frame: Frame) -> bytes:
    return response(frame)


@handler(Opcode.Version, auth=False, bucket=False)
def _version(conn: Connection, frame: Frame) -> bytes:
    return response(frame, value=f"dcpkv-{__version__}".encode())


@handler(Opcode.Quit, auth=False, bucket=False)
def _quit(conn: Connection, frame: Frame) -> bytes:
    raise CloseConnection(response(frame))


@handler(Opcode.Hello, auth=False, bucket=False)
def _hello(conn: Connection, frame: Frame) -> bytes:
    raw = bytes(frame.value)
    if len(raw) % 2:
        raise Reply(Status.Einval, b"Hello value must be a list of 2-byte feature codes")
    conn.agent = bytes(frame.key).decode("utf-8", "replace")[:200]
    conn.features = set()
    for i in range(0, len(raw), 2):
        code = int.from_bytes(raw[i : i + 2], "big")
        if code in SUPPORTED_FEATURES:
            conn.features.add(HelloFeature(code))
    acked = b"".join(int(f).to_bytes(2, "big") for f in sorted(conn.features))
    return response(frame, value=acked)


@handler(Opcode.SaslListMechs, auth=False, bucket=False)
def _sasl_list(conn: Connection, frame: Frame) -> bytes:
    return response(frame, value=SaslSession.list_mechanisms())


@handler(Opcode.SaslAuth, auth=False, bucket=False)
def _sasl_auth(conn: Connection, frame: Frame) -> bytes:
    conn.sasl = SaslSession(conn.server.users)
    try:
        done, answer = conn.sasl.start(
            bytes(frame.key).decode("ascii", "replace"), bytes(frame.value)
        )
    except AuthFailed as exc:
        conn.server.log.info("auth failed from %s: %s", conn.peer, exc)
        conn.user = None
        raise Reply(Status.AuthError, b"Authentication failed") from None
    if not done:
        return response(frame, Status.AuthContinue, value=answer)
    conn.authenticated(conn.sasl.user)
    return response(frame, value=b"Authenticated")


@handler(Opcode.SaslStep, auth=False, bucket=False)
def _sasl_step(conn: Connection, frame: Frame) -> bytes:
    if conn.sasl is None:
        raise Reply(Status.AuthError)
    try:
        answer = conn.sasl.step(bytes(frame.key).decode("ascii", "replace"), bytes(frame.value))
    except AuthFailed as exc:
        conn.server.log.info("auth failed from %s: %s", conn.peer, exc)
        conn.user = None
        raise Reply(Status.AuthError, b"Authentication failed") from None
    conn.authenticated(conn.sasl.user)
    return response(frame, value=answer)


@handler(Opcode.SelectBucket, bucket=False)
def _select_bucket(conn: Connection, frame: Frame) -> bytes:
    name = bytes(frame.key).decode("utf-8", "replace")
    if name not in conn.server.buckets:
        raise Reply(Status.KeyEnoent, f"no bucket named {name!r}".encode())
    conn.bucket_name = name
    return response(frame)


@handler(Opcode.GetErrorMap, auth=False, bucket=False)
def _error_map(conn: Connection, frame: Frame) -> bytes:
    if len(frame.value) != 2:
        raise Reply(Status.Einval, b"GetErrorMap wants a 2-byte version")
    version = int.from_bytes(frame.value, "big")
    return response(frame, value=error_map_json(version), datatype=0x01)


@handler(Opcode.GetClusterConfig, bucket=True)
def _cluster_config(conn: Connection, frame: Frame) -> bytes:
    return response(frame, value=conn.server.cluster_map(conn.bucket_name), datatype=0x01)


def not_my_vbucket(conn: Connection) -> Reply:
    """NotMyVbucket carrying the cluster map, so a smart client can re-route."""
    return Reply(Status.NotMyVbucket, conn.server.cluster_map(conn.bucket_name))


__all__ = [
    "HANDLERS",
    "RESPONSE_HANDLERS",
    "CloseConnection",
    "Connection",
    "Reply",
    "cluster_map_json",
    "handler",
    "not_my_vbucket",
    "response",
]

"""What the server keeps about one client connection, and how a handler refuses a request.

Theory of operation
-------------------
A :class:`Connection` is the per-connection state every handler may read or change: the
features negotiated by Hello, the authenticated user, the selected bucket, the SASL exchange
in progress, and the DCP producer once the connection opened as one. It holds no socket and
no handler: :mod:`dcpkv.server.dispatch` routes each decoded request to its handler, and the
asyncio shell (:mod:`dcpkv.server.app`) owns the transport.

A handler answers with a response message, or refuses by raising :class:`Reply` with a status
(and an optional value, such as the cluster map carried by NotMyVbucket); the dispatcher turns
that into the error response. :class:`CloseConnection` ends the connection after what is
queued is written (Quit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status
from dcpkv.protocol.constants import HelloFeature

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
        HelloFeature.Snappy,
        HelloFeature.Xattr,
        HelloFeature.Duplex,
        # only with Duplex (server requests); the map pushes: dcpkv.server.state
        HelloFeature.ClustermapChangeNotification,
        HelloFeature.SyncReplication,
        # a SyncWrite's answer does not hold back the later requests' (dcpkv.server.app)
        HelloFeature.UnorderedExecution,
    }
)


class Reply(DcpkvError):
    """Answer the current request with ``status`` (and an optional value) and go on."""

    status: Status  # always a status here, where the root allows None

    def __init__(self, status: Status, value: bytes = b"", *, cas: int = 0) -> None:
        super().__init__(status.name)
        self.status = status
        self.value = value
        self.cas = cas


class CloseConnection(DcpkvError):
    """Stop reading this connection after writing what is queued (Quit, fatal errors); the
    first argument, when given, is the last answer to write."""


def _nothing() -> None:
    return None


@dataclass
class Connection:
    server: ServerState
    peer: str = "?"
    peer_host: str = "?"  # the client's address without its port (login throttling)
    features: set[HelloFeature] = field(default_factory=set)
    datatype_mask: int = 0  # the datatype bits Hello negotiated (dcpkv.server.datatype.mask)
    user: str | None = None
    bucket_name: str | None = None
    sasl: Any = None  # the SASL exchange in progress (dcpkv.server.auth.SaslSession)
    agent: str = ""
    manager_term: int = 0  # the term a manager's Hello named (dcpkv.core.manager_term)
    # DCP state, set by Open (see dcpkv.server.dcp_handlers)
    dcp: Any = None
    # Bucket selected on login when the client never sends SelectBucket (plain memcached
    # clients); a bucket named like the user wins, as in Couchbase.
    initial_bucket: str | None = None
    # Closes this connection from outside it (a second DCP Open with the same name); the
    # shell replaces it with one that closes the transport.
    kick: Callable[[], None] = _nothing
    # Writes an answer decided later (a parked SeqnoPersistence); the shell replaces it with
    # one that writes to the transport while the connection is open.
    send: Callable[[bytes], None] = lambda data: None

    def detach(self) -> None:
        """The shell's connection is gone: drop ``kick``, which referenced the shell (a
        cycle that kept a closed connection's buffers alive until a full GC), and stop
        sending it maps."""
        self.kick = _nothing
        self.server.map_subscribers.pop(id(self), None)

    def authenticated(self, user: str | None) -> None:
        self.user = user
        if user is None or self.bucket_name is not None:
            return
        grants = self.server.users.grants(user)
        for name in (user, self.initial_bucket):
            if (
                name is not None
                and name in self.server.buckets
                and grants is not None
                and grants.can_open(name)
            ):
                self.bucket_name = name
                return

    @property
    def bucket(self) -> Any:
        return self.server.buckets[self.bucket_name] if self.bucket_name else None


def check_term(conn: Connection, command: str) -> None:
    """Refuse (Eaccess, logged) a state change from a manager of an older term than the
    newest this node has seen: a deposed leader's late command."""
    fence = conn.server.term_fence
    if not fence.allows(conn.manager_term):
        conn.server.log.warning(
            "refused %s from %s: manager term %d is older than term %d",
            command, conn.peer, conn.manager_term, fence.newest,
        )  # fmt: skip
        message = f"manager term {conn.manager_term} is older than term {fence.newest}"
        raise Reply(Status.Eaccess, message.encode())


def not_my_vbucket(conn: Connection) -> Reply:
    """NotMyVbucket carrying the cluster map, so a smart client can re-route."""
    return Reply(Status.NotMyVbucket, conn.server.cluster_map(conn.bucket_name))

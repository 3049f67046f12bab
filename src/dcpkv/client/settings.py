"""Where a client connects and as whom: the one connection-settings type.

Theory of operation
-------------------
Every client of the project (the DCP consumer, the blocking KV client, the Spark source and
sink, the pipelines, the commands) needs the same four facts: the nodes, the bucket, the user
and the password. :class:`ConnectionSettings` holds them, frozen and picklable (Spark ships it
to executors); the settings of each client *compose* it with their own knobs instead of
repeating the fields. ``nodes`` are the *seeds*: the addresses of a connection string as
the SDKs write it (``couchbase://h1,h2:11210``, ``h1:11210``, ``h1,h2``; :func:`parse_nodes`).
A client bootstraps the cluster map from the first seed that answers and follows the map from
then on (``dcpkv.client.cluster``); :attr:`ConnectionSettings.host` / ``port`` name the first
seed, for messages and for callers that only ever talk to one node.

``tls`` (:class:`~dcpkv.core.tls.TlsSettings`, None: plain TCP) makes every connection of the
client speak TLS to the nodes' TLS ports (the map's ``kvSSL``; seeds must name TLS ports,
11207 by Couchbase's convention). A ``couchbases://`` connection string means TLS
(:func:`scheme_tls`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dcpkv.core.defaults import (
    DEFAULT_BUCKET,
    DEFAULT_HOST,
    DEFAULT_PASSWORD,
    DEFAULT_PORT,
    DEFAULT_USER,
)
from dcpkv.core.errors import DcpkvError
from dcpkv.core.tls import TlsSettings

DEFAULT_TLS_PORT = 11207  # Couchbase's TLS data port


class NodeAddressError(DcpkvError, ValueError):
    """A ``host:port`` that cannot be read."""


@dataclass(frozen=True, slots=True)
class Node:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise NodeAddressError(f"port {text!r} is not a number") from None
    if not 0 < port < 65536:
        raise NodeAddressError(f"port {port} is outside 1..65535")
    return port


SCHEMES = ("couchbase://", "couchbases://", "dcpkv://")


def scheme_tls(url: str) -> tuple[bool, str]:
    """``(tls, rest)`` of a connection string: ``couchbases://`` is TLS, ``couchbase://`` (or
    no scheme) is not; ``rest`` is what follows the scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return False, url
    if f"{scheme.lower()}://" not in SCHEMES:
        raise NodeAddressError(f"unknown scheme {scheme!r}: use couchbase:// or couchbases://")
    return scheme.lower() == "couchbases", rest


def parse_nodes(text: str, default_port: int = DEFAULT_PORT) -> tuple[Node, ...]:
    """A connection string -> its nodes: ``couchbase://h1,h2:11211``, ``h1:11211,h2`` (the
    scheme is optional, a ``?option=..`` tail is ignored); a node without a port gets the
    default one. IPv6 addresses go in brackets: ``[::1]:11210``."""
    body = text.strip()
    for scheme in SCHEMES:
        if body.lower().startswith(scheme):
            body = body[len(scheme) :]
            break
    else:
        if "://" in body:
            raise NodeAddressError(f"{text!r}: only {' and '.join(SCHEMES)} connection strings")
    body = body.partition("?")[0].rstrip("/")
    nodes = []
    for part in (p.strip() for p in body.replace(";", ",").split(",")):
        if not part:
            continue
        nodes.append(_node(part, default_port))
    if not nodes:
        raise NodeAddressError(f"no node in {text!r}")
    return tuple(nodes)


def _node(part: str, default_port: int) -> Node:
    if part.startswith("["):  # [v6 address] or [v6 address]:port
        host, _, rest = part[1:].partition("]")
        return Node(host, parse_port(rest[1:]) if rest.startswith(":") else default_port)
    host, sep, port = part.rpartition(":")
    if not sep:
        return Node(part, default_port)
    if not host:
        raise NodeAddressError(f"{part!r} has no host")
    return Node(host, parse_port(port))


def is_connection_string(text: str) -> bool:
    """Does ``text`` say more than a bare host name (a scheme, a port, several nodes)?"""
    return "://" in text or "," in text or text.startswith("[") or text.count(":") == 1


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """Where a client connects and as whom: the seed ``nodes``, the ``bucket``, the ``user``
    and ``password``, and ``tls`` (None: plain TCP). Frozen and picklable.

    Build one with :meth:`at` (one node, or a connection string given as the host) or
    :meth:`parse` (a connection string)::

        ConnectionSettings.at("127.0.0.1", 11210)
        ConnectionSettings.parse("couchbase://h1,h2:11210", user="alice", password="...")

    The client reads the cluster map from the first seed that answers and follows it from then
    on; ``couchbases://`` (or ``tls=TlsSettings(...)``) makes every connection speak TLS.
    """

    nodes: tuple[Node, ...] = (Node(),)
    bucket: str = DEFAULT_BUCKET
    user: str = DEFAULT_USER
    password: str = DEFAULT_PASSWORD
    tls: TlsSettings | None = None

    @classmethod
    def at(
        cls,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        bucket: str = DEFAULT_BUCKET,
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        tls: TlsSettings | None = None,
    ) -> ConnectionSettings:
        """Settings for one node, or for the nodes of a connection string given as ``host``
        (``couchbase://h1,h2:11210``: every command's ``--host`` takes one); ``port`` is
        then the default of the nodes that name none. ``couchbases://`` asks for TLS (with
        default options when ``tls`` is not given)."""
        if not is_connection_string(host):
            return cls((Node(host, port),), bucket, user, password, tls)
        return cls(parse_nodes(host, port), bucket, user, password, _tls_of(host, tls))

    @classmethod
    def parse(
        cls,
        connection_string: str,
        *,
        bucket: str = DEFAULT_BUCKET,
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        tls: TlsSettings | None = None,
    ) -> ConnectionSettings:
        """Settings for the nodes of a connection string."""
        nodes = parse_nodes(connection_string)
        return cls(nodes, bucket, user, password, _tls_of(connection_string, tls))

    @property
    def connection_string(self) -> str:
        scheme = "couchbases://" if self.tls is not None else "couchbase://"
        return scheme + ",".join(str(n) for n in self.nodes)

    @property
    def host(self) -> str:
        return self.nodes[0].host

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def spark_options(self) -> dict[str, str]:
        """The connection options of the ``dcpkv`` Spark format."""
        return {
            "nodes": ",".join(str(n) for n in self.nodes),
            "bucket": self.bucket,
            "user": self.user,
            "password": self.password,
            **(_tls_options(self.tls) if self.tls is not None else {}),
        }


def _tls_of(connection_string: str, given: TlsSettings | None) -> TlsSettings | None:
    """The TLS options a connection string asks for: ``given``, or defaults for
    ``couchbases://``."""
    if given is not None:
        return given
    return TlsSettings() if scheme_tls(connection_string.strip())[0] else None


def _tls_options(tls: TlsSettings) -> dict[str, str]:
    """The Spark options of :class:`TlsSettings` (see :mod:`dcpkv.spark.options`)."""
    opts = {"tls": "true", "tlsVerify": str(tls.verify).lower()}
    for name, value in (("tlsCa", tls.ca), ("tlsCert", tls.cert), ("tlsKey", tls.key)):
        if value is not None:
            opts[name] = value
    return opts


@dataclass(frozen=True)
class ClientSettings:
    """Where to connect, as whom (``connection``), and how the DCP connection behaves.

    ``buffer_size`` is the flow-control window negotiated with ``connection_buffer_size``
    (0 disables flow control); ``noop_interval`` the producer's Noop period in seconds (the
    connection counts as dead after two silent intervals); ``max_backoff`` caps the delay
    between reconnection attempts; ``retry_timeout`` is how long a request keeps retrying
    while the cluster map catches up with a failover or a vbucket move
    (``dcpkv.client.cluster``), ``request_timeout`` how long one attempt waits for its answer
    (a node that accepts connections but does not answer counts as lost).
    ``include_values=False`` opens the DCP connection with the NoValue flag: mutations arrive
    with an empty value and datatype 0 (raw), for consumers that only need keys and metadata
    (the producer then never reads ejected values back from disk).
    ``compression=True`` asks the producer to Snappy-compress every value it sends
    (``force_value_compression``): fewer bytes on the wire for more CPU on both sides. Events
    carry inflated values either way (the connection always negotiates Snappy, so values the
    bucket keeps compressed arrive as they are stored and are inflated here).
    ``include_prepares=True`` enables SyncWrites on the DCP connection: durable writes arrive
    as :class:`~dcpkv.client.events.Prepare`, then :class:`~dcpkv.client.events.Commit` or
    :class:`~dcpkv.client.events.Abort` events (a prepare is not visible to readers until its
    commit; a disk snapshot brings a committed one as a plain Mutation). Off by default:
    committed changes only, a commit as the Mutation or Deletion it made.
    """

    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    name: str = "dcpkv-client"
    buffer_size: int = 20 * 1024 * 1024
    noop_interval: float = 10.0
    connect_timeout: float = 10.0
    max_backoff: float = 5.0
    retry_timeout: float = 30.0
    request_timeout: float = 2.5
    include_values: bool = True
    compression: bool = False
    include_prepares: bool = False

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
"""

from __future__ import annotations

from dataclasses import dataclass

from dcpkv.core.defaults import (
    DEFAULT_BUCKET,
    DEFAULT_HOST,
    DEFAULT_PASSWORD,
    DEFAULT_PORT,
    DEFAULT_USER,
)
from dcpkv.core.errors import DcpkvError


class NodeError(DcpkvError, ValueError):
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
        raise NodeError(f"port {text!r} is not a number") from None
    if not 0 < port < 65536:
        raise NodeError(f"port {port} is outside 1..65535")
    return port


SCHEMES = ("couchbase://", "dcpkv://")


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
            raise NodeError(f"{text!r}: only {' and '.join(SCHEMES)} connection strings")
    body = body.partition("?")[0].rstrip("/")
    nodes = []
    for part in (p.strip() for p in body.replace(";", ",").split(",")):
        if not part:
            continue
        nodes.append(_node(part, default_port))
    if not nodes:
        raise NodeError(f"no node in {text!r}")
    return tuple(nodes)


def _node(part: str, default_port: int) -> Node:
    if part.startswith("["):  # [v6 address] or [v6 address]:port
        host, _, rest = part[1:].partition("]")
        return Node(host, parse_port(rest[1:]) if rest.startswith(":") else default_port)
    host, sep, port = part.rpartition(":")
    if not sep:
        return Node(part, default_port)
    if not host:
        raise NodeError(f"{part!r} has no host")
    return Node(host, parse_port(port))


def is_connection_string(text: str) -> bool:
    """Does ``text`` say more than a bare host name (a scheme, a port, several nodes)?"""
    return "://" in text or "," in text or text.startswith("[") or text.count(":") == 1


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    nodes: tuple[Node, ...] = (Node(),)
    bucket: str = DEFAULT_BUCKET
    user: str = DEFAULT_USER
    password: str = DEFAULT_PASSWORD

    @classmethod
    def at(
        cls,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        bucket: str = DEFAULT_BUCKET,
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
    ) -> ConnectionSettings:
        """Settings for one node, or for the nodes of a connection string given as ``host``
        (``couchbase://h1,h2:11210``: every command's ``--host`` takes one); ``port`` is
        then the default of the nodes that name none."""
        if not is_connection_string(host):
            return cls((Node(host, port),), bucket, user, password)
        return cls(parse_nodes(host, port), bucket, user, password)

    @classmethod
    def parse(
        cls,
        connection_string: str,
        *,
        bucket: str = DEFAULT_BUCKET,
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
    ) -> ConnectionSettings:
        """Settings for the nodes of a connection string."""
        return cls(parse_nodes(connection_string), bucket, user, password)

    @property
    def connection_string(self) -> str:
        return "couchbase://" + ",".join(str(n) for n in self.nodes)

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
        }

"""Where a client connects and as whom: the one connection-settings type.

Theory of operation
-------------------
Every client of the project (the DCP consumer, the blocking KV client, the Spark source and
sink, the pipelines, the commands) needs the same four facts: the nodes, the bucket, the user
and the password. :class:`ConnectionSettings` holds them, frozen and picklable (Spark ships it
to executors); the settings of each client *compose* it with their own knobs instead of
repeating the fields. ``nodes`` is a tuple so that a cluster connection string
(``couchbase://h1,h2:11210``) can fill it later; a single node is the whole cluster today, so
clients connect to the first one (:attr:`ConnectionSettings.host` / ``port``).

``tls`` (:class:`~dcpkv.core.tls.TlsOptions`, None: plain TCP) makes every connection of the
client speak TLS to the nodes' TLS ports (which ``nodes`` must then name, 11207 by
Couchbase's convention). A ``couchbases://`` connection string means TLS:
:func:`scheme_tls` reads the scheme; the connection-string parser calls it.
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
from dcpkv.core.tls import TlsOptions

DEFAULT_TLS_PORT = 11207  # Couchbase's TLS data port


def scheme_tls(url: str) -> tuple[bool, str]:
    """``(tls, rest)`` of a connection string: ``couchbases://`` is TLS, ``couchbase://`` (or
    no scheme) is not; ``rest`` is what follows the scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return False, url
    if scheme not in ("couchbase", "couchbases"):
        raise NodeError(f"unknown scheme {scheme!r}: use couchbase:// or couchbases://")
    return scheme == "couchbases", rest


class NodeError(DcpkvError, ValueError):
    """A ``host:port`` that cannot be read."""


@dataclass(frozen=True, slots=True)
class Node:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise NodeError(f"port {text!r} is not a number") from None
    if not 0 < port < 65536:
        raise NodeError(f"port {port} is outside 1..65535")
    return port


def parse_nodes(text: str) -> tuple[Node, ...]:
    """``"h1,h2:11211"`` -> nodes; a node without a port gets the default one."""
    nodes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        nodes.append(Node(host, parse_port(port)) if sep else Node(part, DEFAULT_PORT))
    if not nodes:
        raise NodeError(f"no node in {text!r}")
    return tuple(nodes)


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    nodes: tuple[Node, ...] = (Node(),)
    bucket: str = DEFAULT_BUCKET
    user: str = DEFAULT_USER
    password: str = DEFAULT_PASSWORD
    tls: TlsOptions | None = None

    @classmethod
    def at(
        cls,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        bucket: str = DEFAULT_BUCKET,
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        tls: TlsOptions | None = None,
    ) -> ConnectionSettings:
        """Settings for one node."""
        return cls((Node(host, port),), bucket, user, password, tls)

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


def _tls_options(tls: TlsOptions) -> dict[str, str]:
    """The Spark options of :class:`TlsOptions` (see :mod:`dcpkv.spark.options`)."""
    opts = {"tls": "true", "tlsVerify": str(tls.verify).lower()}
    for name, value in (("tlsCa", tls.ca), ("tlsCert", tls.cert), ("tlsKey", tls.key)):
        if value is not None:
            opts[name] = value
    return opts

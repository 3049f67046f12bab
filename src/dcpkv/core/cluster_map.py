"""The cluster map as a client reads it: which node holds each vbucket active, and its replicas.

Theory of operation
-------------------
A node serves the bucket's config JSON (GetClusterConfig, and the body of a NotMyVbucket
answer) in the shape Couchbase's SDKs read: ``vBucketServerMap.serverList`` names the nodes
(``host:port``), ``vBucketMap`` gives each vbucket a *chain* ``[active, replica1, ..]`` of
indexes into that list, -1 meaning "nobody". The map's version is the pair
``(revEpoch, rev)``, compared epoch first; a client keeps the newest map it has seen and
ignores older ones, which may arrive late from a node that has not heard of a change yet.

:class:`ClusterMap` is that map as a frozen value, parsed without I/O (:meth:`ClusterMap.parse`
raises :class:`ClusterMapError` on anything else). ``nodesExt[].thisNode`` marks the node that
served the map; :meth:`ClusterMap.parse` can rename that entry to the address the client
actually reached (``served_by``), as the SDKs do: a node bound to every interface may name
itself by an address that is not the one the client used (a single plain node keeps working
behind any address). With ``tls``, every node is named by its TLS port instead (``kvSSL`` in
``nodesExt``, as the SDKs read it for ``couchbases://``). Used by the client library (routing)
and shared here so that any layer that reads a map reads it the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dcpkv.core.errors import DcpkvError

NOBODY = -1


class ClusterMapError(DcpkvError, ValueError):
    """A config that is not a readable cluster map."""


@dataclass(frozen=True, slots=True)
class ClusterMap:
    """See the module docstring. ``chains[vb][0]`` is the active's index, the rest replicas."""

    servers: tuple[str, ...]
    chains: tuple[tuple[int, ...], ...]
    version: tuple[int, int] = (0, 0)  # (revEpoch, rev)

    @classmethod
    def parse(
        cls, raw: bytes | str, *, served_by: str | None = None, tls: bool = False
    ) -> ClusterMap:
        """The map of a config JSON; ``served_by`` (``host:port``) renames the ``thisNode``;
        ``tls`` names the nodes by their TLS ports."""
        try:
            doc = json.loads(raw)
            server_map = doc["vBucketServerMap"]
            servers = [str(s) for s in server_map["serverList"]]
            chains = tuple(tuple(int(i) for i in chain) for chain in server_map["vBucketMap"])
            version = (int(doc.get("revEpoch", 0)), int(doc["rev"]))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ClusterMapError(f"not a cluster map: {type(exc).__name__}: {exc}") from None
        for vb, chain in enumerate(chains):
            if not chain or any(not NOBODY <= i < len(servers) for i in chain):
                raise ClusterMapError(f"vbucket {vb}: chain {list(chain)} names no listed node")
        me = _this_node(doc, servers) if served_by is not None else None
        if tls:
            servers = _tls_servers(doc, servers)
        if me is not None and served_by is not None and served_by not in servers:
            servers[me] = served_by
        return cls(tuple(servers), chains, version)

    @property
    def num_vbuckets(self) -> int:
        return len(self.chains)

    def active(self, vbucket: int) -> str | None:
        """``host:port`` of the vbucket's active node, None when nobody holds it active."""
        index = self.chains[vbucket][0] if vbucket < len(self.chains) else NOBODY
        return None if index == NOBODY else self.servers[index]

    def replicas(self, vbucket: int) -> tuple[str, ...]:
        """The nodes holding a replica of the vbucket, in chain order."""
        if vbucket >= len(self.chains):
            return ()
        return tuple(self.servers[i] for i in self.chains[vbucket][1:] if i != NOBODY)

    def actives_of(self, server: str) -> list[int]:
        """The vbuckets ``server`` holds active."""
        if server not in self.servers:
            return []
        index = self.servers.index(server)
        return [vb for vb, chain in enumerate(self.chains) if chain[0] == index]

    def newer_than(self, other: ClusterMap | None) -> bool:
        return other is None or self.version > other.version


def _this_node(doc: dict[str, Any], servers: list[str]) -> int | None:
    """Index in ``servers`` of the entry ``nodesExt`` marks ``thisNode``, if any."""
    for ext in doc.get("nodesExt") or ():
        if isinstance(ext, dict) and ext.get("thisNode"):
            kv = (ext.get("services") or {}).get("kv")
            name = f"{ext.get('hostname', '')}:{kv}"
            return servers.index(name) if name in servers else None
    return None


def _tls_servers(doc: dict[str, Any], servers: list[str]) -> list[str]:
    """Each ``host:kv`` of the server list as ``host:kvSSL`` (from ``nodesExt``)."""
    tls_of: dict[str, str] = {}
    for ext in doc.get("nodesExt") or ():
        services = (ext.get("services") or {}) if isinstance(ext, dict) else {}
        if "kv" in services and "kvSSL" in services:
            host = ext.get("hostname", "")
            tls_of[f"{host}:{services['kv']}"] = f"{host}:{services['kvSSL']}"
    missing = [s for s in servers if s not in tls_of]
    if missing:
        raise ClusterMapError(f"no TLS port (kvSSL) in the map for {', '.join(missing)}")
    return [tls_of[s] for s in servers]

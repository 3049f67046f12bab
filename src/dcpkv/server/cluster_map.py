"""The cluster map a client bootstraps from (GetClusterConfig, and NotMyVbucket answers).

The official SDKs connect to the addresses the map names and route each key to the node the
``vBucketMap`` says is active for it, so the map must carry the host and port clients really
reach. A one-node server is active for every vbucket and has no replicas. On a cluster the
manager pushes each node the map (SetClusterConfig): :class:`PushedConfig` reads its version,
``(revEpoch, rev)``, which only grows: a node keeps the newest it was given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PushedConfig:
    """A config JSON as a manager pushed it: kept raw (clients get it byte for byte)."""

    raw: bytes
    version: tuple[int, int]  # (revEpoch, rev): compared as a pair, epoch first
    # this node's name in the cluster (``nodesExt``'s ``thisNode``): what the manager's maps
    # and replication topologies call it, which may differ from the address it binds (a
    # proxy or NAT in front of it)
    this_node: str | None = None

    @classmethod
    def parse(cls, raw: bytes) -> PushedConfig:
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"the cluster config is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError("the cluster config must be a JSON object")
        rev = _revision(doc, "rev", None)
        epoch = _revision(doc, "revEpoch", 0)
        return cls(raw, (epoch, rev), _this_node(doc))


def _this_node(doc: dict[str, object]) -> str | None:
    nodes = doc.get("nodesExt")
    for ext in nodes if isinstance(nodes, list) else ():
        if isinstance(ext, dict) and ext.get("thisNode"):
            kv = (ext.get("services") or {}).get("kv")
            return f"{ext.get('hostname', '')}:{kv}" if kv else None
    return None


def _revision(doc: dict[str, object], name: str, default: int | None) -> int:
    value = doc.get(name, default)
    if type(value) is not int or value < 0:
        raise ValueError(f"the cluster config needs a non-negative integer {name!r}")
    return value


def cluster_map(
    *,
    bucket: str,
    host: str,
    port: int,
    num_vbuckets: int,
    rev: int = 1,
    vbucket_map: Sequence[Sequence[int]] | None = None,
    server_list: Sequence[str] | None = None,
    num_replicas: int = 0,
    tls_port: int | None = None,
) -> dict:
    """``tls_port``: this node's TLS data port, advertised as ``kvSSL`` (what an SDK given
    ``couchbases://`` connects to)."""
    servers = list(server_list or [f"{host}:{port}"])
    vb_map = [list(row) for row in vbucket_map] if vbucket_map else [[0]] * num_vbuckets
    return {
        "rev": rev,
        "name": bucket,
        "uri": f"/pools/default/buckets/{bucket}",
        "nodeLocator": "vbucket",
        "bucketCapabilities": ["couchapi", "dcp", "cbhello", "touch", "cccp", "xattr", "nodesExt"],
        "nodes": [{"hostname": s, "ports": {"direct": int(s.rsplit(":", 1)[1])}} for s in servers],
        "nodesExt": [
            {
                "hostname": s.rsplit(":", 1)[0],
                "services": {
                    "kv": int(s.rsplit(":", 1)[1]),
                    **({"kvSSL": tls_port} if tls_port and s == f"{host}:{port}" else {}),
                },
                **({"thisNode": True} if s == f"{host}:{port}" else {}),
            }
            for s in servers
        ],
        "vBucketServerMap": {
            "hashAlgorithm": "CRC",
            "numReplicas": num_replicas,
            "serverList": servers,
            "vBucketMap": vb_map,
        },
    }


def cluster_map_json(doc: dict) -> bytes:
    """A :func:`cluster_map` as the compact JSON a client receives."""
    return json.dumps(doc, separators=(",", ":")).encode()

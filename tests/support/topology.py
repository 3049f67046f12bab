"""Give a real server's vbuckets a replication topology (SetVbucket's JSON value), as the
cluster manager does, so that durable writes become SyncWrites on a single node: a chain of
this node alone is a majority of one; a chain naming an absent replica never reaches one."""

from __future__ import annotations

import json

from dcpkv.core.vbucket import vbucket_for_key
from support.rawclient import RawClient

SET_VBUCKET, ACTIVE, SUCCESS = 0x3D, 1, 0x00
VBUCKETS = 16  # serverproc starts servers with 16


def set_topologies(port: int, chains: dict[int, list[str | None]]) -> None:
    """Each vbucket of ``chains`` active on the node at ``port``, with that one chain."""
    raw = RawClient(port)
    raw.login()
    try:
        for vb, chain in chains.items():
            value = json.dumps({"topology": [chain]}).encode()
            answer = raw.call(SET_VBUCKET, value=value, extras=bytes((ACTIVE,)), vbucket=vb)
            assert answer.status == SUCCESS, answer
    finally:
        raw.close()


def alone(port: int, vbuckets: range = range(VBUCKETS)) -> dict[int, list[str | None]]:
    """The single-node chain for each of ``vbuckets``."""
    return {vb: [f"127.0.0.1:{port}"] for vb in vbuckets}


def key_in(vbucket: int, prefix: str, num_vbuckets: int = VBUCKETS) -> bytes:
    """The first key ``prefix-N`` that hashes to ``vbucket``."""
    n = 0
    while vbucket_for_key(f"{prefix}-{n}".encode(), num_vbuckets) != vbucket:
        n += 1
    return f"{prefix}-{n}".encode()

"""The cluster configuration the manager owns: nodes, buckets and their maps, settings.

Theory of operation
-------------------
One JSON document, ``cluster.json`` in the manager's data folder, is the truth the manager
drives the nodes towards; the nodes only ever hold what it says. Every change is decided in
memory as a new :class:`ClusterConfig` (the values are frozen), written with
:func:`~dcpkv.core.files.atomic_write` *before* any node is told (so a manager killed half way
re-drives the nodes to the same decision on restart), and only then applied. A restart loads
the file and changes nothing on nodes that already match it.

A node is ``active`` (in the map, or waiting for one) or ``failed`` (failed over: out of the
map, never driven again until re-added, which rebalance will bring). A bucket has a vbucket
count, a replica count, a uuid (pushed in its config, so a node tells whose data it holds)
and, once enough nodes joined, its map. :class:`FailoverConfig` holds the automatic failover
switch, its timeout (5 s by default) and the count of automatic failovers an operator has not yet
acknowledged (stored, so a manager restart does not grant a second one:
:mod:`~dcpkv.cluster.auto_failover`). The rebalance record (:class:`RebalanceConfig`) keeps
what a rebalance must still do (nodes to take out or back in) and how the last one ended, so
a manager that died mid-rebalance tells so and a re-run finishes the job.

Loading refuses a corrupt or unknown file with one clear line (:class:`ClusterConfigError`):
the manager must never guess a cluster's layout.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from dcpkv.cluster.auto_failover import MAX_COUNT
from dcpkv.cluster.handover import Handover
from dcpkv.cluster.vbucket_map import VBucketMap
from dcpkv.core.errors import DcpkvError
from dcpkv.core.files import atomic_write

FILE_NAME = "cluster.json"
FORMAT = 1
DEFAULT_AUTO_FAILOVER_TIMEOUT_S = 5
# Couchbase 7.1 went down to 1 s; below ~3 heartbeats a busy but live node may be failed over
MIN_AUTO_FAILOVER_TIMEOUT_S, MAX_AUTO_FAILOVER_TIMEOUT_S = 1, 3600
# ns_server moves 4 vbuckets per node at a time; a cluster of a few nodes: about 16 in flight
DEFAULT_MOVES_AT_ONCE = 16


class ClusterConfigError(DcpkvError, ValueError):
    """The cluster configuration file is unreadable, or a change to it is invalid."""


class NodeState(StrEnum):
    ACTIVE = "active"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class NodeConfig:
    name: str  # host:port of its memcached port
    state: NodeState = NodeState.ACTIVE

    @property
    def host(self) -> str:
        return self.name.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.name.rpartition(":")[2])


@dataclass(frozen=True, slots=True)
class BucketConfig:
    name: str
    num_vbuckets: int
    num_replicas: int
    uuid: str
    map: VBucketMap | None = None


@dataclass(frozen=True, slots=True)
class FailoverConfig:
    auto_failover_enabled: bool = False
    auto_failover_timeout_s: int = DEFAULT_AUTO_FAILOVER_TIMEOUT_S
    auto_failover_count: int = 0  # automatic failovers since an operator last reset it
    # A replica that must roll back after a failover first writes to the new active what it
    # has that the new active did not change since (spec 002; pushed to the nodes in the map)
    repair_on_rollback: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "enabled": self.auto_failover_enabled,
            "timeout": self.auto_failover_timeout_s,
            "count": self.auto_failover_count,
            "maxCount": MAX_COUNT,
        }


class Recovery(StrEnum):
    DELTA = "delta"  # keeps its data: its copies roll back as the rules say, then catch up
    FULL = "full"  # wiped first


class RebalanceState(StrEnum):
    IDLE = "idle"
    RUNNING = "running"  # found at start-up: the manager died mid-rebalance
    STOPPED = "stopped"  # by an operator, or by a failover
    FAILED = "failed"  # a move failed and was reverted


@dataclass(frozen=True, slots=True)
class RebalanceConfig:
    """What a rebalance must still do, so a re-run finishes it (:mod:`.rebalance`): the
    nodes to take out, the failed-over nodes to take back in, and how the last run ended; and
    the group of handovers under way (:mod:`.handover`), which a restarted manager ends."""

    state: RebalanceState = RebalanceState.IDLE
    eject: tuple[str, ...] = ()
    recover: tuple[tuple[str, Recovery], ...] = ()
    error: str | None = None
    moves_at_once: int = DEFAULT_MOVES_AT_ONCE  # a setting: vbucket moves in flight at a time
    handover: Handover | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "eject": list(self.eject),
            "recover": {n: r.value for n, r in self.recover},
            "error": self.error,
            "movesAtOnce": self.moves_at_once,
            "handover": None if self.handover is None else self.handover.to_json(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RebalanceConfig:
        handover = doc.get("handover")
        return cls(
            RebalanceState(doc["state"]),
            tuple(doc["eject"]),
            tuple((n, Recovery(r)) for n, r in doc["recover"].items()),
            doc.get("error"),
            int(doc.get("movesAtOnce", DEFAULT_MOVES_AT_ONCE)),
            None if handover is None else Handover.from_json(handover),
        )


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    """An automatic failover, kept in the file so status shows it after a manager restart."""

    node: str
    reason: str
    at: float  # seconds since the epoch

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason, "at": self.at}


MAX_EVENTS = 20  # the newest automatic failovers kept


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...] = ()
    buckets: tuple[BucketConfig, ...] = ()
    settings: FailoverConfig = field(default_factory=FailoverConfig)
    events: tuple[FailoverEvent, ...] = ()
    rebalance: RebalanceConfig = field(default_factory=RebalanceConfig)

    def with_event(self, event: FailoverEvent) -> ClusterConfig:
        return replace(self, events=(*self.events, event)[-MAX_EVENTS:])

    def node(self, name: str) -> NodeConfig | None:
        return next((n for n in self.nodes if n.name == name), None)

    def active_nodes(self) -> list[str]:
        return [n.name for n in self.nodes if n.state == NodeState.ACTIVE]

    def with_node(self, node: NodeConfig) -> ClusterConfig:
        others = tuple(n for n in self.nodes if n.name != node.name)
        if self.node(node.name) is None:
            return replace(self, nodes=(*others, node))
        return replace(self, nodes=tuple(node if n.name == node.name else n for n in self.nodes))

    def with_bucket(self, bucket: BucketConfig) -> ClusterConfig:
        kept = tuple(b for b in self.buckets if b.name != bucket.name)
        return replace(self, buckets=(*kept, bucket))


def new_bucket(name: str, num_vbuckets: int, num_replicas: int) -> BucketConfig:
    return BucketConfig(name, num_vbuckets, num_replicas, uuid.uuid4().hex)


# -- the file -------------------------------------------------------------------------------


def to_json(config: ClusterConfig) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "nodes": [{"name": n.name, "state": n.state.value} for n in config.nodes],
        "buckets": [
            {
                "name": b.name,
                "numVBuckets": b.num_vbuckets,
                "numReplicas": b.num_replicas,
                "uuid": b.uuid,
                "map": None if b.map is None else b.map.to_config(b.name, b.uuid),
            }
            for b in config.buckets
        ],
        "settings": {
            "autoFailover": _settings_json(config.settings),
            "repairOnRollback": config.settings.repair_on_rollback,
        },
        "events": [e.to_json() for e in config.events],
        "rebalance": config.rebalance.to_json(),
    }


def _settings_json(settings: FailoverConfig) -> dict[str, Any]:
    doc = settings.to_json()
    del doc["maxCount"]  # a constant of this version, not a setting
    return doc


def from_json(doc: Any) -> ClusterConfig:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a format-{FORMAT} cluster configuration")
    nodes = tuple(NodeConfig(n["name"], NodeState(n["state"])) for n in doc["nodes"])
    buckets = tuple(
        BucketConfig(
            name=b["name"],
            num_vbuckets=int(b["numVBuckets"]),
            num_replicas=int(b["numReplicas"]),
            uuid=str(b["uuid"]),
            map=None if b["map"] is None else VBucketMap.from_config(b["map"]),
        )
        for b in doc["buckets"]
    )
    auto = doc["settings"]["autoFailover"]
    # "count", "repairOnRollback", "events" and "rebalance" came later: an older file has
    # none to carry (nor a rebalance to finish)
    settings = FailoverConfig(
        bool(auto["enabled"]),
        int(auto["timeout"]),
        int(auto.get("count", 0)),
        bool(doc["settings"].get("repairOnRollback", False)),
    )
    events = tuple(
        FailoverEvent(str(e["node"]), str(e["reason"]), float(e["at"]))
        for e in doc.get("events", [])
    )
    rebalance = RebalanceConfig.from_json(doc["rebalance"]) if "rebalance" in doc else None
    return ClusterConfig(nodes, buckets, settings, events, rebalance or RebalanceConfig())


def load(data_dir: Path) -> ClusterConfig | None:
    """The saved configuration, or None when the folder holds none yet."""
    path = data_dir / FILE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ClusterConfigError(f"cannot read {path}: {exc}") from None
    try:
        return from_json(json.loads(raw))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        message = f"{path} is corrupt ({exc}); refusing to guess the cluster"
        raise ClusterConfigError(message) from None


def save(data_dir: Path, config: ClusterConfig) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(to_json(config), indent=1).encode()
    atomic_write(data_dir / FILE_NAME, raw, data_dir / f"{FILE_NAME}.tmp")

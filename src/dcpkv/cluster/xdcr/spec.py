"""XDCR's records: remote clusters, replications and their settings (the manager keeps them).

Theory of operation
-------------------
A :class:`RemoteCluster` names another cluster's data nodes and the user the replicator logs
in as there (give it only the write privilege on the target bucket: ``data_writer[b]``; it
asks GetMeta too, which needs ``data_reader[b]``), with TLS options. A :class:`Replication`
copies one bucket of this cluster to a bucket of a remote, continuously, with its
:class:`ReplicationConfig` (the reference's names in :meth:`ReplicationConfig.from_params`);
its id is ``remote/fromBucket/toBucket``. Each record reads and writes its JSON form; a bad
value is a ``ValueError`` naming it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dcpkv.client.settings import ConnectionSettings
from dcpkv.cluster.xdcr.pipeline import (
    BATCH_BYTES,
    BATCH_ITEMS,
    OPTIMISTIC_THRESHOLD,
    ChangeFilter,
)
from dcpkv.core.tls import TlsSettings


@dataclass(frozen=True, slots=True)
class RemoteCluster:
    name: str
    hostname: str  # host:port of a data node, or a connection string
    username: str
    password: str
    tls_ca: str | None = None  # a CA file: the connections to the remote speak TLS

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"remote cluster name {self.name!r}: not empty, no '/'")
        if not self.hostname:
            raise ValueError("remote cluster hostname is required")

    def connection(self, bucket: str) -> ConnectionSettings:
        tls = TlsSettings(ca=self.tls_ca) if self.tls_ca else None
        return ConnectionSettings.at(
            self.hostname, bucket=bucket, user=self.username, password=self.password, tls=tls
        )

    def to_json(self, *, secrets: bool = True) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        if not secrets:
            doc.pop("password")
        return doc


_SETTING_NAMES = {  # the reference's REST names -> ours
    "filterExpression": "filter_expression",
    "filterSkipDeletions": "skip_deletions",
    "filterSkipExpirations": "skip_expirations",
    "checkpointInterval": "checkpoint_interval_s",
    "workerBatchSize": "batch_items",
    "docBatchSizeKb": "batch_kb",
    "optimisticReplicationThreshold": "optimistic_threshold",
    "failureRestartInterval": "restart_interval_s",
    "pauseRequested": "paused",
}


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    filter_expression: str | None = None  # a regular expression on the key
    skip_deletions: bool = False
    skip_expirations: bool = False
    checkpoint_interval_s: float = 10.0  # the reference's default is 600 s
    batch_items: int = BATCH_ITEMS
    batch_kb: int = BATCH_BYTES // 1024
    optimistic_threshold: int = OPTIMISTIC_THRESHOLD
    restart_interval_s: float = 10.0
    paused: bool = False
    _filter: ChangeFilter = field(default_factory=ChangeFilter, init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "_filter",
            ChangeFilter(self.filter_expression, self.skip_deletions, self.skip_expirations),
        )
        if not 1 <= self.batch_items <= 10_000 or not 1 <= self.batch_kb <= 100_000:
            raise ValueError("workerBatchSize must be 1..10000 and docBatchSizeKb 1..100000")
        if self.checkpoint_interval_s <= 0 or self.restart_interval_s <= 0:
            raise ValueError("checkpointInterval and failureRestartInterval must be above 0")

    @property
    def filter(self) -> ChangeFilter:
        return self._filter

    def with_params(self, params: dict[str, Any]) -> ReplicationConfig:
        """These settings with the reference-named ``params`` given (unknown names refused)."""
        changes: dict[str, Any] = {}
        for name, value in params.items():
            ours = _SETTING_NAMES.get(name)
            if ours is None:
                raise ValueError(f"unknown replication setting {name!r}")
            changes[ours] = _typed(ours, value)
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {ref: getattr(self, ours) for ref, ours in _SETTING_NAMES.items()}


def _typed(name: str, value: Any) -> Any:
    kind = ReplicationConfig.__dataclass_fields__[name].type
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() not in ("true", "false"):
                raise ValueError
            return str(value).lower() == "true"
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        raise ValueError(f"replication setting {name}: bad value {value!r}") from None
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True, slots=True)
class Replication:
    from_bucket: str
    to_cluster: str
    to_bucket: str
    settings: ReplicationConfig = ReplicationConfig()

    @property
    def id(self) -> str:
        return f"{self.to_cluster}/{self.from_bucket}/{self.to_bucket}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "fromBucket": self.from_bucket, "toCluster": self.to_cluster,
            "toBucket": self.to_bucket, "settings": self.settings.to_json(),
        }  # fmt: skip

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Replication:
        settings = ReplicationConfig().with_params(doc.get("settings", {}))
        return cls(doc["fromBucket"], doc["toCluster"], doc["toBucket"], settings)

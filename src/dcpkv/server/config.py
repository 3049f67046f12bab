"""The data server's settings: embedded defaults, a TOML config file, command-line overrides.

Precedence, lowest first: the defaults below, then the config file, then flags. A config file
looks like::

    host = "127.0.0.1"
    port = 11210
    data_dir = "./dcpkv-data"

    [users]
    Administrator = "password"

    [buckets.default]
    vbuckets = 1024
    memory_quota_mb = 256
    eviction_policy = "valueOnly"   # or "fullEviction": whole items leave memory (docs/server.md)
    durability_min_level = "none"   # or majority, majorityAndPersistActive, persistToMajority
    durability_timeout_ms = 30000   # a durable write's timeout when it names none
    conflict_resolution = "seqno"    # or "lww", fixed at creation (docs/xdcr.md)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dcpkv.core.defaults import (
    DEFAULT_BUCKET,
    DEFAULT_HOST,
    DEFAULT_PASSWORD,
    DEFAULT_PORT,
    DEFAULT_USER,
)
from dcpkv.core.errors import DcpkvError
from dcpkv.engine.durability_monitor import DEFAULT_TIMEOUT_MS as DEFAULT_DURABILITY_TIMEOUT_MS
from dcpkv.engine.hash_table import EvictionPolicy
from dcpkv.protocol.constants import DurabilityLevel
from dcpkv.protocol.durability import level_named

DEFAULT_VBUCKETS = 1024
STORAGE = "rocksdb"  # the one storage engine: a bucket's `storage` may only name it


class ConfigError(DcpkvError, ValueError):
    """A config file or flag value that cannot be used."""


@dataclass(frozen=True)
class BucketSettings:
    name: str = DEFAULT_BUCKET
    num_vbuckets: int = DEFAULT_VBUCKETS  # the file's and the flag's `vbuckets`
    memory_quota_mb: int = 256
    # What leaves memory over the quota: values only, or whole items (EvictionPolicy)
    eviction_policy: str = EvictionPolicy.VALUE_ONLY.value
    compression_mode: str = "passive"  # off | passive | active (see dcpkv.engine.document)
    # SyncWrites (docs/server.md): every write at least this level (none, majority,
    # majorityAndPersistActive, persistToMajority), and the timeout of a durable write that
    # names none.
    durability_min_level: str = "none"
    durability_timeout_ms: int = DEFAULT_DURABILITY_TIMEOUT_MS

    @property
    def min_level(self) -> DurabilityLevel | None:
        return level_named(self.durability_min_level)

    # How with-meta (XDCR) writes are judged: seqno or lww, fixed when the bucket is created
    conflict_resolution: str = "seqno"

    def __post_init__(self) -> None:
        try:
            level_named(self.durability_min_level)
        except ValueError as exc:
            raise ConfigError(f"bucket {self.name!r}: {exc}") from None
        if not 1 <= self.durability_timeout_ms <= 0xFFFE:
            raise ConfigError(
                f"bucket {self.name!r}: durability_timeout_ms must be 1..65534, "
                f"not {self.durability_timeout_ms}"
            )
        if self.eviction_policy not in {p.value for p in EvictionPolicy}:
            raise ConfigError(
                f"bucket {self.name!r}: eviction_policy must be valueOnly or fullEviction, "
                f"not {self.eviction_policy!r}"
            )
        if self.compression_mode not in ("off", "passive", "active"):
            raise ConfigError(
                f"bucket {self.name!r}: compression_mode must be off, passive or active"
            )
        if self.conflict_resolution not in ("seqno", "lww"):
            raise ConfigError(
                f"bucket {self.name!r}: conflict_resolution must be seqno or lww, "
                f"not {self.conflict_resolution!r}"
            )
        if not 1 <= self.num_vbuckets <= 1024:
            raise ConfigError(
                f"bucket {self.name!r}: vbuckets must be 1..1024, not {self.num_vbuckets}"
            )
        if self.memory_quota_mb < 1:
            raise ConfigError(f"bucket {self.name!r}: memory_quota_mb must be at least 1")
        if not self.name or len(self.name) > 100 or not self.name.replace("-", "_").isidentifier():
            raise ConfigError(f"bucket name {self.name!r}: use letters, digits, '_' and '-'")


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    data_dir: Path = Path("./dcpkv-data")
    buckets: tuple[BucketSettings, ...] = (BucketSettings(),)
    users: dict[str, str] = field(default_factory=lambda: {DEFAULT_USER: DEFAULT_PASSWORD})
    flush_interval_s: float = 0.05
    # Tombstones older than this are purged by the periodic compaction (Couchbase's "metadata
    # purge interval"; 3 days there too). A consumer that was away longer gets rolled back to 0.
    tombstone_purge_age_s: float = 3 * 24 * 3600
    compaction_interval_s: float = 3600
    # A node of a cluster: new buckets start with no vbuckets; the manager gives them states
    # and the map. Otherwise one node is the whole cluster (every vbucket active).
    managed: bool = False
    # A second port speaking TLS (Couchbase's 11207 convention), with its certificate chain
    # and key; with a CA file, clients must present a certificate that chains to it.
    tls_port: int | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    # Limits that keep one client from hurting the others (see server/app.py, "Limits").
    max_connections: int = 4096
    unauth_idle_timeout_s: float = 30.0
    # Prometheus metrics over HTTP on this port (0: a free one; None: not served), on
    # metrics_host: loopback by default, as the reference's per-node port (server/metrics.py)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, not {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be 0..65535, not {self.metrics_port}")
        if self.tls_port is not None and not 0 <= self.tls_port <= 65535:
            raise ConfigError(f"tls_port must be 0..65535, not {self.tls_port}")
        if (self.tls_port is None) != (self.tls_cert is None or self.tls_key is None):
            raise ConfigError("TLS needs all of tls_port, tls_cert and tls_key (or none)")
        if self.tls_ca is not None and self.tls_port is None:
            raise ConfigError("tls_ca (client certificates) needs tls_port")
        if self.max_connections < 1:
            raise ConfigError(f"max_connections must be at least 1, not {self.max_connections}")
        if self.unauth_idle_timeout_s <= 0:
            raise ConfigError("unauth_idle_timeout_s must be above 0")
        if not self.buckets:
            raise ConfigError("at least one bucket is needed")

    def bucket(self, name: str) -> BucketSettings | None:
        return next((b for b in self.buckets if b.name == name), None)

    def with_overrides(self, **flags: Any) -> ServerSettings:
        """Apply the flags a user actually gave (None means "not given")."""
        given = {k: v for k, v in flags.items() if v is not None}
        for name in ("data_dir", *_PATHS):
            if name in given:
                given[name] = Path(given[name])
        return replace(self, **given)


_PATHS = ("tls_cert", "tls_key", "tls_ca")


def load_config(path: Path | None) -> ServerSettings:
    """The defaults, overlaid with ``path`` when given."""
    if path is None:
        return ServerSettings()
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return _from_doc(doc, path)


def _from_doc(doc: dict[str, Any], path: Path) -> ServerSettings:
    numbers = (
        "port", "flush_interval_s", "tombstone_purge_age_s", "compaction_interval_s",
        "max_connections", "unauth_idle_timeout_s", "tls_port", "metrics_port",
    )  # fmt: skip
    plain = ("host", "managed", "metrics_host", *numbers)
    known = {"data_dir", "users", "buckets", *plain, *_PATHS}
    unknown = set(doc) - known
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = {k: doc[k] for k in plain if k in doc}
    for name in ("data_dir", *_PATHS):
        if name in doc:
            kwargs[name] = Path(doc[name])
    if "users" in doc:
        users = doc["users"]
        if not isinstance(users, dict) or not all(isinstance(v, str) for v in users.values()):
            raise ConfigError(f"{path}: [users] maps user names to password strings")
        kwargs["users"] = dict(users)
    if "buckets" in doc:
        try:
            kwargs["buckets"] = tuple(
                _bucket(name, settings) for name, settings in doc["buckets"].items()
            )
        except TypeError as exc:
            raise ConfigError(f"{path}: bad bucket settings: {exc}") from None
    try:
        return ServerSettings(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _check_storage(bucket: str, storage: object) -> None:
    """The ``storage`` key of earlier config files: RocksDB is the one engine, so only
    "rocksdb" (what it said by default) is taken, and it changes nothing."""
    if storage != STORAGE:
        raise ConfigError(
            f"bucket {bucket!r}: storage {storage!r} is not served: {STORAGE} is the one storage "
            "engine, and a bucket the SQLite engine wrote is converted to it at its first start "
            "(docs/storage.md); remove the storage setting"
        )


def _bucket(name: str, settings: dict[str, Any]) -> BucketSettings:
    """A ``[buckets.NAME]`` table: its ``vbuckets`` key is the count, ``num_vbuckets``."""
    fields = dict(settings)
    if "vbuckets" in fields:
        fields["num_vbuckets"] = fields.pop("vbuckets")
    elif "num_vbuckets" in fields:
        raise TypeError("unexpected keyword argument 'num_vbuckets' (the key is vbuckets)")
    _check_storage(name, fields.pop("storage", STORAGE))
    return BucketSettings(name=name, **fields)


def with_cli_flags(
    config: ServerSettings,
    *,
    bucket: str | None = None,
    vbuckets: int | None = None,
    memory_quota_mb: int | None = None,
    eviction_policy: str | None = None,
    compression_mode: str | None = None,
    durability_min_level: str | None = None,
    durability_timeout_ms: int | None = None,
    conflict_resolution: str | None = None,
    user: str | None = None,
    password: str | None = None,
    **flags: Any,
) -> ServerSettings:
    """The ``dcpkv server`` flags over ``config``: bucket flags change the first bucket, and
    ``--user``/``--password`` make that the one user (None means "flag not given")."""
    first = config.buckets[0]
    given: dict[str, Any] = {
        "name": bucket, "num_vbuckets": vbuckets, "memory_quota_mb": memory_quota_mb,
        "eviction_policy": eviction_policy,
        "compression_mode": compression_mode,
        "durability_min_level": durability_min_level,
        "durability_timeout_ms": durability_timeout_ms,
        "conflict_resolution": conflict_resolution,
    }  # fmt: skip
    if any(value is not None for value in given.values()):
        changed = replace(first, **{k: v for k, v in given.items() if v is not None})
        flags["buckets"] = (changed, *config.buckets[1:])
    if user is not None or password is not None:
        name = user if user is not None else next(iter(config.users), DEFAULT_USER)
        secret = password if password is not None else config.users.get(name, DEFAULT_PASSWORD)
        flags["users"] = {name: secret}
    return config.with_overrides(**flags)

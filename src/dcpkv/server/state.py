"""What every connection of one server shares: settings, users, buckets, the cluster map."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from dcpkv.server.auth import UserStore
from dcpkv.server.cluster_map import cluster_map_json
from dcpkv.server.config import ServerConfig


@dataclass
class ServerState:
    config: ServerConfig
    buckets: dict[str, Any] = field(default_factory=dict)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("dcpkv.server"))
    # The port actually bound (the config may ask for 0, "any free port").
    port: int | None = None
    cluster_rev: int = 1
    connections: int = 0  # open client connections (the shell keeps it current)
    # (bucket, DCP connection name) -> the Connection that opened it as a producer
    dcp_producers: dict[tuple[str, str], Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.users = UserStore(dict(self.config.users))

    def cluster_map(self, bucket: str | None) -> bytes:
        name = bucket or self.config.buckets[0].name
        bucket_config = self.config.bucket(name)
        return cluster_map_json(
            bucket=name,
            host=self.config.host,
            port=self.port if self.port is not None else self.config.port,
            num_vbuckets=bucket_config.vbuckets if bucket_config else 1024,
            rev=self.cluster_rev,
        )

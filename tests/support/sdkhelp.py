"""The official Couchbase SDK in the cluster tests: a connection bootstrapped from one node
that follows the map (polled every half second), kept in the list of the ``sdk`` fixture
(conftest.py), which closes it."""

from __future__ import annotations

from datetime import timedelta

from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster as SdkCluster
from couchbase.collection import Collection
from couchbase.options import ClusterOptions, ClusterTimeoutOptions

from support.serverproc import ServerProcess


def options(kv_timeout_s: float = 2.0) -> ClusterOptions:
    """The admin's login, short timeouts, the map polled every half second."""
    timeouts = ClusterTimeoutOptions(
        kv_timeout=timedelta(seconds=kv_timeout_s),
        connect_timeout=timedelta(seconds=10),
        bootstrap_timeout=timedelta(seconds=10),
    )
    return ClusterOptions(
        PasswordAuthenticator("Administrator", "password"),
        timeout_options=timeouts,
        config_poll_interval=timedelta(milliseconds=500),
    )


def connect(node: ServerProcess, opened: list[SdkCluster], kv_timeout_s: float = 2.0) -> Collection:
    cluster = SdkCluster(f"couchbase://127.0.0.1:{node.port}", options(kv_timeout_s))
    opened.append(cluster)
    return cluster.bucket("default").default_collection()

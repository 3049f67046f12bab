"""The official Couchbase SDK connected to a real server subprocess, for module fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster
from couchbase.collection import Collection
from couchbase.options import ClusterOptions, ClusterTimeoutOptions

from support.serverproc import ServerProcess


@contextmanager
def module_server(root: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(root / "data", root / "server.log")
    srv.start()
    try:
        yield srv
    finally:
        srv.reap()


@contextmanager
def sdk_collection(port: int, **options: object) -> Iterator[Collection]:
    """The default collection of the default bucket, the SDK's default authentication;
    ``options`` go to ClusterOptions (e.g. ``enable_compression=False``)."""
    timeouts = ClusterTimeoutOptions(
        kv_timeout=timedelta(seconds=5),
        connect_timeout=timedelta(seconds=10),
        bootstrap_timeout=timedelta(seconds=10),
    )
    options = ClusterOptions(
        PasswordAuthenticator("Administrator", "password"), timeout_options=timeouts, **options
    )
    cluster = Cluster(f"couchbase://127.0.0.1:{port}", options)
    try:
        yield cluster.bucket("default").default_collection()
    finally:
        cluster.close()

"""Where the main job's data lives: one ``dcpkv server`` child, or a local cluster.

Both back-ends answer the same questions (start, stop, how other commands find them, the
bucket's vbucket count), so the job (``demo.py``) never asks which one it has.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console

from dcpkv.app.node import LocalNode, NodeStartError
from dcpkv.client.cluster import ClusterKV
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.cluster.admin_client import AdminError, admin_request
from dcpkv.cluster.local import LocalCluster, LocalClusterError
from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_PORT, DEFAULT_USER
from dcpkv.pipelines.loader import bucket_vbuckets

CLUSTER_READY_S = 60.0  # the manager places the map and every node answers


class OneNode:
    """``--nodes 1``: one ``dcpkv server`` child."""

    def __init__(self, data_dir: Path, server_log: Path, port: int, num_vbuckets: int) -> None:
        self.node = LocalNode(data_dir, server_log, port=port, num_vbuckets=num_vbuckets)
        self.data_dir = data_dir

    def start(self, console: Console) -> ConnectionSettings:
        port = self.node.start()
        console.print(f"Node up: 127.0.0.1:{port} (pid {self.node.pid}), data in {self.data_dir}")
        return ConnectionSettings.at(port=port)

    def stop(self, console: Console) -> None:
        if self.node.pid is None:
            return  # it never started
        status = self.node.stop()
        console.print(f"Node stopped (pid {self.node.pid}, exit status {status}).")

    def describe(self) -> str:
        return f"node 127.0.0.1:{self.node.port} (data in {self.data_dir})"

    def cli_options(self) -> str:
        """What the other commands need to find it."""
        return "" if self.node.port == DEFAULT_PORT else f" --port {self.node.port}"

    def num_vbuckets(self, ep: ConnectionSettings) -> int:
        return bucket_vbuckets(ep)[0]

    def extra_help(self) -> list[str]:
        return []


class ClusterNodes:
    """``--nodes N``: N managed nodes and the manager, as ``dcpkv cluster up`` runs them."""

    def __init__(self, root: Path, nodes: int, replicas: int, num_vbuckets: int) -> None:
        self.cluster = LocalCluster(root, nodes, replicas, num_vbuckets)
        self.ep = ConnectionSettings()

    def start(self, console: Console) -> ConnectionSettings:
        try:
            with console.status(f"Starting {self.cluster.nodes} nodes and the manager..."):
                self.cluster.start()
                self._wait_ready()
        except (LocalClusterError, AdminError) as exc:
            raise NodeStartError(str(exc)) from None
        nodes = ",".join(self.cluster.address(c) for c in self.cluster.data_nodes)
        self.ep = ConnectionSettings.at(f"couchbase://{nodes}")
        pids = ", ".join(str(c.proc.pid) for c in self.cluster.children if c.proc is not None)
        console.print(
            f"Cluster up: {self.ep.connection_string}, manager {self.cluster.manager_url} "
            f"(pids {pids}), {self.cluster.replicas} replica(s), data in {self.cluster.data_dir}"
        )
        return self.ep

    def _wait_ready(self) -> None:
        """Until the map is placed and every node answers the manager's heartbeats."""
        deadline = time.monotonic() + CLUSTER_READY_S
        while time.monotonic() < deadline:
            doc = admin_request(
                self.cluster.manager_url, "GET", "/pools/default", user=DEFAULT_USER,
                password=DEFAULT_PASSWORD,
            )  # fmt: skip
            placed = all(b["placed"] for b in doc["buckets"])
            if placed and all(n["status"] == "healthy" for n in doc["nodes"]):
                return
            time.sleep(0.2)
        raise NodeStartError(f"the cluster was not ready in {CLUSTER_READY_S:.0f} s")

    def stop(self, console: Console) -> None:
        self.cluster.stop()
        codes = [c.proc.returncode for c in self.cluster.children if c.proc is not None]
        console.print(f"Cluster stopped (exit statuses {codes}).")

    def describe(self) -> str:
        return f"cluster {self.ep.connection_string} (data in {self.cluster.data_dir})"

    def cli_options(self) -> str:
        return f" --host {self.ep.connection_string}"

    def num_vbuckets(self, ep: ConnectionSettings) -> int:
        return cluster_vbuckets(ep)

    def extra_help(self) -> list[str]:
        url = self.cluster.manager_url
        return [f"  cluster  dcpkv cluster status --url {url}   (nodes, failovers, lag)"]


Nodes = OneNode | ClusterNodes


def cluster_vbuckets(ep: ConnectionSettings) -> int:
    """The bucket's vbucket count, from the cluster map (one node's stats count only the
    vbuckets active there)."""

    async def read() -> int:
        kv = await ClusterKV.open(ClientSettings(ep))
        try:
            return len(kv.bucket_vbuckets())
        finally:
            await kv.close()

    return asyncio.run(read())

"""``dcpkv manager``: the manager and its HTTP API in one process, until SIGINT/SIGTERM.

Theory of operation
-------------------
Start the :class:`~dcpkv.cluster.manager.Manager` (load or create the configuration, sync
every node), then serve the admin API (:mod:`~dcpkv.cluster.http_api`) on the given port (0
picks a free one; ``--port-file`` receives the bound port once listening, written
atomically, which is how tests and ``dcpkv cluster up`` find it). A signal stops the API,
the health watcher and the node sessions; nodes are left exactly as they are: they serve on
without the manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from dcpkv.client.settings import ConnectionSettings, Node
from dcpkv.cluster.config import NodeState
from dcpkv.cluster.http_api import make_app, read_params
from dcpkv.cluster.leadership import DEFAULT_LEASE_TTL_S
from dcpkv.cluster.manager import Manager
from dcpkv.cluster.node_link import LinkTls
from dcpkv.cluster.xdcr.service import XdcrService
from dcpkv.cluster.xdcr.service import add_routes as add_xdcr_routes
from dcpkv.core import logs
from dcpkv.core.files import atomic_write
from dcpkv.core.tls import server_context

log = logging.getLogger("dcpkv.cluster")


@dataclass(frozen=True, slots=True)
class ManagerSettings:
    data_dir: Path
    host: str
    port: int
    port_file: Path | None
    seeds: list[str]
    bucket: str
    num_vbuckets: int
    replicas: int
    user: str
    password: str
    # the HTTP API over TLS (https) with this certificate chain and key
    tls_cert: Path | None = None
    tls_key: Path | None = None
    link_tls: LinkTls | None = None  # the links to the nodes over TLS
    # several managers, one leader (cluster/leader_service.py): etcd's client endpoints
    etcd: str | None = None
    name: str | None = None  # this manager's name among them (default: host:port)
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    log_level: str = "info"  # (dcpkv.core.logs)
    log_format: str = "text"


async def serve(options: ManagerSettings) -> None:
    if options.etcd is not None:
        from dcpkv.cluster.leader_service import serve_on_etcd

        await serve_on_etcd(options)
        return
    manager = Manager(options.data_dir, options.user, options.password, link_tls=options.link_tls)
    await manager.start(
        seeds=options.seeds,
        bucket=options.bucket,
        num_vbuckets=options.num_vbuckets,
        replicas=options.replicas,
    )
    xdcr = XdcrService(options.data_dir, lambda bucket: _this_cluster(manager, options, bucket))
    app = make_app(manager)
    add_xdcr_routes(app, xdcr, read_params)
    xdcr.start()
    runner = web.AppRunner(app, access_log=None)
    try:
        await listen(runner, options)
        await until_signalled()
    finally:
        await runner.cleanup()
        await xdcr.stop()
        await manager.stop()


async def listen(runner: web.AppRunner, options: ManagerSettings) -> str:
    """Serve ``runner``'s app on the options' address; its URL (the port file written)."""
    ssl = None
    if options.tls_cert is not None and options.tls_key is not None:
        ssl = server_context(options.tls_cert, options.tls_key)
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port, ssl_context=ssl)
    await site.start()
    port = runner.addresses[0][1]
    scheme = "https" if ssl is not None else "http"
    host = "127.0.0.1" if options.host in ("0.0.0.0", "") else options.host
    log.info("dcpkv manager listening on %s://%s:%d/", scheme, options.host, port)
    if options.port_file is not None:
        tmp = options.port_file.with_name(options.port_file.name + ".tmp")
        atomic_write(options.port_file, str(port).encode(), tmp)
    return f"{scheme}://{host}:{port}"


def _this_cluster(manager: Manager, options: ManagerSettings, bucket: str) -> ConnectionSettings:
    """How an XDCR replicator reads this cluster: its nodes, as the cluster admin."""
    nodes = tuple(Node(n.host, n.port) for n in manager.config.nodes if n.state is NodeState.ACTIVE)
    return ConnectionSettings(nodes=nodes, bucket=bucket, user=options.user,
                              password=options.password)  # fmt: skip


async def until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)


def run(options: ManagerSettings) -> None:
    logs.configure(options.log_level, options.log_format)
    asyncio.run(serve(options))

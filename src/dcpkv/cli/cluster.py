"""``dcpkv manager`` and ``dcpkv cluster ...``: run the cluster manager, and talk to it.

Theory of operation
-------------------
Thin shells: ``manager`` runs :mod:`dcpkv.cluster.service`; ``cluster status|add-node|
failover|rebalance|remove-node|recover|settings`` send one request each to the manager's HTTP API
(:mod:`dcpkv.cluster.admin_client`) and print the answer (``--json`` for the raw document);
``cluster up`` runs :mod:`dcpkv.cluster.local`. Heavy imports happen inside the commands so
``dcpkv --help`` stays fast. A refusal prints the manager's one-line reason and exits 1.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from dcpkv.cli.options import (
    DEFAULT_MANAGER_PORT,
    DEFAULT_MANAGER_URL,
    ClusterAdmin,
    ClusterAdminPassword,
    JsonAnswer,
    LogFormat,
    LogLevel,
    ManagerUrl,
    manager_call,
)
from dcpkv.core.defaults import DEFAULT_BUCKET, DEFAULT_HOST, DEFAULT_PASSWORD, DEFAULT_USER

cluster_app = typer.Typer(
    help="Talk to the cluster manager (status, add-node, failover, rebalance, remove-node, "
    "recover, settings), or start a "
    "whole development cluster on this machine (up).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)

Wait = Annotated[bool, typer.Option("--wait/--no-wait", help="Show progress until it ends.")]


def register(app: typer.Typer) -> None:
    """Add ``manager`` and ``cluster`` to the root command."""
    app.command("manager")(manager)
    app.add_typer(cluster_app, name="cluster")


def manager(
    data_dir: Annotated[
        Path, typer.Option(help="Where the cluster configuration (cluster.json) lives.")
    ] = Path("./dcpkv-manager"),
    port: Annotated[int, typer.Option(help="HTTP admin API port; 0 picks a free one.")] = (
        DEFAULT_MANAGER_PORT
    ),
    host: Annotated[str, typer.Option(help="Address to listen on.")] = DEFAULT_HOST,
    node: Annotated[
        list[str] | None,
        typer.Option(help="A data node (host:port), repeatable: seeds a new cluster."),
    ] = None,
    replicas: Annotated[int, typer.Option(help="Replicas per vbucket, 0-3 (new cluster).")] = 1,
    vbuckets: Annotated[int, typer.Option(help="vbuckets of the bucket (new cluster).")] = 1024,
    bucket: Annotated[str, typer.Option(help="The bucket's name (new cluster).")] = (
        DEFAULT_BUCKET
    ),
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
    port_file: Annotated[
        Path | None, typer.Option(help="Write the bound port here once listening.")
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="Serve the admin API over https with this certificate.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Its private key.")] = None,
    node_tls_ca: Annotated[
        Path | None,
        typer.Option(help="Talk to the nodes over TLS, trusting this CA (at their TLS ports)."),
    ] = None,
    node_tls_port_offset: Annotated[
        int, typer.Option(help="A node's TLS port minus its data port (11207 - 11210).")
    ] = -3,
    etcd: Annotated[
        str | None,
        typer.Option(
            help="etcd client endpoints (host:port,...): the configuration lives there and "
            "the managers elect one leader that acts (see docs/cluster.md)."
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="This manager's name among several [default: host:port].")
    ] = None,
    lease_ttl: Annotated[
        int,
        typer.Option(
            min=2, help="Seconds a leader acts without etcd's keep-alive answer (--etcd)."
        ),
    ] = 10,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Run the cluster manager: it owns the cluster configuration and drives the data nodes.

    On first start (no cluster.json in --data-dir) the --node seeds, which must be
    `dcpkv server --managed` nodes holding nothing (or this cluster's data), become the
    cluster: actives and replicas are placed evenly, never a replica with its active, and each
    node is given its vbucket states and the map over the memcached protocol, as the cluster
    admin. Later starts load the saved configuration and change nothing on nodes that already
    match it. The HTTP admin API (`dcpkv cluster ...`) serves until SIGINT/SIGTERM; the data
    nodes keep serving while the manager is down.
    """
    from dcpkv.cluster.config import ClusterConfigError
    from dcpkv.cluster.manager import Refused
    from dcpkv.cluster.service import ManagerSettings, run
    from dcpkv.core.tls import TlsError

    options = ManagerSettings(
        data_dir=data_dir,
        host=host,
        port=port,
        port_file=port_file,
        seeds=list(node or []),
        bucket=bucket,
        num_vbuckets=vbuckets,
        replicas=replicas,
        user=user,
        password=password,
        tls_cert=tls_cert,
        tls_key=tls_key,
        link_tls=_link_tls(node_tls_ca, node_tls_port_offset),
        etcd=etcd,
        name=name,
        lease_ttl_s=lease_ttl,
        log_level=log_level,
        log_format=log_format,
    )
    if (tls_cert is None) != (tls_key is None):
        typer.echo("dcpkv manager: give both --tls-cert and --tls-key", err=True)
        raise typer.Exit(2)
    if etcd is not None:
        from dcpkv.cluster.etcd_store import parse_endpoints

        try:
            parse_endpoints(etcd)
        except ValueError as exc:
            typer.echo(f"dcpkv manager: --etcd: {exc}", err=True)
            raise typer.Exit(2) from None
    from dcpkv.core.logs import LogSettingsError, check

    try:
        check(log_level, log_format)
    except LogSettingsError as exc:
        typer.echo(f"dcpkv manager: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        run(options)
    except (Refused, ClusterConfigError, TlsError) as exc:
        typer.echo(f"dcpkv manager: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"dcpkv manager: cannot start: {exc}", err=True)
        raise typer.Exit(1) from None


def _link_tls(ca: Path | None, offset: int) -> Any:
    from dcpkv.cluster.node_link import LinkTls
    from dcpkv.core.tls import TlsSettings

    return LinkTls(TlsSettings(ca=str(ca)), offset) if ca is not None else None


def _call(
    url: str, method: str, path: str, user: str, password: str, **params: str
) -> dict[str, Any]:
    result: dict[str, Any] = manager_call("cluster", url, method, path, user, password, params)
    return result


@cluster_app.command()
def status(
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
    json_: JsonAnswer = False,
) -> None:
    """Nodes (membership, health), vbuckets active and replica on each, replication lag.

    Lag is the number of items a node's replica vbuckets are behind their actives.
    """
    managers = _managers(url, user, password)
    if managers is not None and not json_:  # first: it says why nothing else may answer
        _echo_managers(managers)
    doc = _call(url, "GET", "/pools/default", user, password)
    if managers is not None:
        doc["managers"] = managers
    if json_:
        typer.echo(json.dumps(doc, indent=1))
        return
    for bucket in doc["buckets"]:
        placed = f"map rev {bucket['rev']}" if bucket["placed"] else "map not placed yet"
        typer.echo(
            f"bucket {bucket['name']}: {bucket['numVBuckets']} vbuckets, "
            f"{bucket['numReplicas']} replica(s), {placed}"
        )
    typer.echo(
        f"{'node':<22} {'membership':<10} {'health':<10} {'active':>6} {'replica':>7} {'lag':>8}"
    )
    for n in doc["nodes"]:
        lag = "?" if n["replicationLag"] is None else str(n["replicationLag"])
        typer.echo(
            f"{n['hostname']:<22} {n['clusterMembership']:<10} {n['status']:<10} "
            f"{n['actives']:>6} {n['replicas']:>7} {lag:>8}"
        )
    _echo_auto_failover(doc["autoFailover"])
    if "rebalance" in doc:
        _echo_rebalance(doc["rebalance"])


def _managers(url: str, user: str, password: str) -> dict[str, Any] | None:
    """The managers over etcd (None: one manager, no etcd)."""
    from dcpkv.cluster.admin_client import AdminError, admin_request

    try:
        return admin_request(url, "GET", "/pools/default/managers", user=user, password=password)
    except AdminError:
        return None


def _echo_managers(doc: dict[str, Any]) -> None:
    leader = doc["leader"] or "none (no lease held: see etcd below)"
    typer.echo(f"managers: leader {leader}, term {doc['term']}, lease TTL {doc['leaseTtl']} s")
    for name, url in doc["managers"]:
        typer.echo(f"  {name:<20} {url}{'  (leader)' if name == doc['leader'] else ''}")
    etcd = doc["etcd"]
    if etcd["healthy"]:
        typer.echo(f"etcd {etcd['version']}: healthy, raft term {etcd['raftTerm']}")
    else:
        typer.echo(f"etcd: UNHEALTHY ({etcd.get('error', '?')}): no failover can run")


def _echo_rebalance(rebalance: dict[str, Any]) -> None:
    progress = rebalance["progress"]
    line = f"rebalance: {rebalance['state']}"
    if progress["vbucketsTotal"]:
        line += (
            f", {progress['vbucketsMoved']}/{progress['vbucketsTotal']} vbuckets moved, "
            f"{progress['itemsTransferred']} items transferred"
        )
        if progress["eta"] is not None:
            line += f", about {progress['eta']:.0f} s left"
    if rebalance.get("error"):
        line += f" ({rebalance['error']})"
    typer.echo(line)
    pending = [*rebalance["eject"], *rebalance["recover"]]
    if pending and rebalance["state"] != "running":
        typer.echo(f"  still to do (run `dcpkv cluster rebalance`): {', '.join(pending)}")


def _echo_auto_failover(auto: dict[str, Any]) -> None:
    typer.echo(
        f"auto-failover: {'on' if auto['enabled'] else 'off'}, timeout {auto['timeout']} s, "
        f"count {auto['count']} of {auto['maxCount']}"
    )
    for event in auto.get("events", []):
        when = time.strftime("%H:%M:%S", time.localtime(event["at"]))
        typer.echo(f"  {when} failed over {event['node']} automatically: {event['reason']}")
    for node, why in auto.get("held", {}).items():
        typer.echo(f"  {node} is unresponsive and not failed over: {why}")


@cluster_app.command("add-node")
def add_node(
    node: Annotated[str, typer.Argument(help="The data node, host:port of its memcached port.")],
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Add a data node to the cluster.

    The manager checks it first: reachable, accepts the cluster admin, has the bucket with the
    cluster's vbucket count, and holds no data but this cluster's. A node that fails a check
    is refused with the reason, and nothing changes. A fresh cluster's map is placed as soon
    as enough nodes joined for its replicas; a node added to a placed cluster waits, empty,
    for rebalance.
    """
    doc = _call(url, "POST", "/controller/addNode", user, password, hostname=node)
    placed = "the map is placed" if doc["placed"] else "the map waits for more nodes"
    typer.echo(f"added {doc['added']}; {placed}")


@cluster_app.command()
def failover(
    node: Annotated[str, typer.Argument(help="The node to fail over, host:port.")],
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Fail a node over: its vbuckets become active on their replicas.

    For each vbucket the node held active, the replica furthest ahead is promoted (highest
    high prepared seqno, then high seqno, then persisted seqno);
    the node leaves the map and every remaining node gets the new map. Refused (nothing
    changes) for the last node, or when a vbucket it holds active has no replica. Writes the
    failed node acknowledged only from memory can be lost.
    """
    doc = _call(url, "POST", "/controller/failOver", user, password, otpNode=node)
    typer.echo(
        f"failed over {doc['failedOver']}: {doc['promoted']} vbucket(s) promoted, "
        f"map rev {doc['rev']}"
    )


@cluster_app.command()
def rebalance(
    eject: Annotated[
        list[str] | None,
        typer.Option(help="A node to take out (host:port), repeatable: its vbuckets move away."),
    ] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the running rebalance.")] = False,
    wait: Wait = True,
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Move vbuckets so every node holds an even share (nodes added in, ejected ones out).

    The manager plans a new map for the nodes that stay (as few moves as an even spread
    allows) and moves vbuckets a few at a time while the cluster serves: each new copy is
    built from the current active, handed over with a takeover stream, the map changes, and
    old copies are deleted once the new ones are persisted. A move that fails puts the old
    active back and stops the rebalance; run it again to finish. Exits 1 unless it completes.
    """
    if stop:
        doc = _call(url, "POST", "/controller/stopRebalance", user, password)
        _echo_rebalance(doc)
        return
    params = {"ejectedNodes": ",".join(eject)} if eject else {}
    doc = _call(url, "POST", "/controller/rebalance", user, password, **params)
    typer.echo(f"rebalance started: {doc['moves']} vbucket move(s) over {', '.join(doc['nodes'])}")
    if wait:
        _follow_rebalance(url, user, password)


def _follow_rebalance(url: str, user: str, password: str) -> None:
    """A progress bar until the rebalance ends; exit 1 unless it completed."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("vbuckets, {task.fields[items]} items"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("rebalancing", total=None, items=0)
        while True:
            doc = _call(url, "GET", "/pools/default/rebalanceProgress", user, password)
            p = doc["progress"]
            bar.update(
                task, total=p["vbucketsTotal"], completed=p["vbucketsMoved"],
                items=p["itemsTransferred"],
            )  # fmt: skip
            if doc["state"] != "running":
                break
            time.sleep(0.5)
    _echo_rebalance(doc)
    if doc["state"] != "idle":
        raise typer.Exit(1)


@cluster_app.command("remove-node")
def remove_node(
    node: Annotated[str, typer.Argument(help="The node to take out, host:port.")],
    wait: Wait = True,
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Remove a node gracefully: a rebalance moves its vbuckets away, then it leaves.

    Unlike failover nothing is lost and no replica is promoted early: the node serves until
    each of its vbuckets is handed over.
    """
    doc = _call(url, "POST", "/controller/rebalance", user, password, ejectedNodes=node)
    typer.echo(f"removing {node}: {doc['moves']} vbucket move(s)")
    if wait:
        _follow_rebalance(url, user, password)


@cluster_app.command()
def recover(
    node: Annotated[str, typer.Argument(help="The failed-over node to take back, host:port.")],
    full: Annotated[
        bool,
        typer.Option("--full/--delta", help="Wipe it first (full), or keep its data (delta)."),
    ] = False,
    wait: Wait = True,
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Take a failed-over node back in, then rebalance.

    Delta recovery keeps its data: its vbuckets become replicas of the current actives, roll
    back where their history left the actives' (the failover logs decide) and copy only what
    changed since. Full recovery deletes its vbuckets first and copies everything.
    """
    how = "full" if full else "delta"
    _call(url, "POST", "/controller/setRecoveryType", user, password, otpNode=node,
          recoveryType=how)  # fmt: skip
    doc = _call(url, "POST", "/controller/rebalance", user, password)
    typer.echo(f"recovering {node} ({how}): {doc['moves']} vbucket move(s)")
    if wait:
        _follow_rebalance(url, user, password)


@cluster_app.command()
def settings(
    auto_failover: Annotated[
        bool | None, typer.Option("--auto-failover/--no-auto-failover", help="Switch it.")
    ] = None,
    timeout: Annotated[
        int | None,
        typer.Option(help="Seconds (1-3600) a node may not answer before auto-failover."),
    ] = None,
    reset_auto_failover_count: Annotated[
        bool,
        typer.Option(
            "--reset-auto-failover-count",
            help="Acknowledge the automatic failovers done: allow the next one.",
        ),
    ] = False,
    rebalance_moves: Annotated[
        int | None, typer.Option(help="vbucket moves a rebalance runs at a time (1-64).")
    ] = None,
    repair_on_rollback: Annotated[
        bool | None,
        typer.Option(
            "--repair-on-rollback/--no-repair-on-rollback",
            help="Before a replica rolls back after a failover, write to the new active the "
            "documents it has that the new active did not change since (spec 002's repair).",
        ),
    ] = None,
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Show the cluster's settings, or change them (stored by the manager).

    With auto-failover on, a node that answers no heartbeat for the timeout is failed over by
    the manager, at most one node until an operator resets the count, and never a node holding
    active a vbucket that has no replica (see `dcpkv cluster status` for why a node is held).
    With repair on rollback, writes a failover would drop are saved when nobody changed their
    documents since: a replica ahead of the promoted one offers them to it before rolling back.
    """
    if reset_auto_failover_count:
        _call(url, "POST", "/settings/autoFailover/resetCount", user, password)
    if rebalance_moves is not None:
        doc = _call(url, "POST", "/settings/rebalance", user, password,
                    movesAtOnce=str(rebalance_moves))  # fmt: skip
        typer.echo(f"rebalance: {doc['movesAtOnce']} vbucket moves at a time")
    if repair_on_rollback is not None:
        flag = "true" if repair_on_rollback else "false"
        _call(url, "POST", "/settings/rollbackRepair", user, password, repairOnRollback=flag)
    repair = _call(url, "GET", "/settings/rollbackRepair", user, password)
    params: dict[str, str] = {}
    if auto_failover is not None:
        params["enabled"] = "true" if auto_failover else "false"
    if timeout is not None:
        params["timeout"] = str(timeout)
    method = "POST" if params else "GET"
    doc = _call(url, method, "/settings/autoFailover", user, password, **params)
    _echo_auto_failover(doc)
    typer.echo(f"repair on rollback: {'on' if repair['repairOnRollback'] else 'off'}")


def _etcd_members(nodes: int, wanted: bool | None) -> int:
    """How many etcd members ``up`` starts (0: one manager on cluster.json)."""
    import shutil

    if wanted is False or (wanted is None and nodes < 3):
        return 0
    if shutil.which("etcd") is None:
        line = "etcd is not installed (Debian: apt-get install etcd-server)"
        if wanted:
            typer.echo(f"dcpkv cluster up: {line}", err=True)
            raise typer.Exit(1)
        typer.echo(f"dcpkv cluster up: {line}: one manager, no etcd", err=True)
        return 0
    return 3 if nodes >= 3 else 1


@cluster_app.command()
def up(
    nodes: Annotated[int, typer.Option(help="Data nodes to start.")] = 3,
    replicas: Annotated[int, typer.Option(help="Replicas per vbucket (0-3).")] = 1,
    data_dir: Annotated[
        Path, typer.Option(help="Folder for every node's data, the manager's and the logs.")
    ] = Path("./dcpkv-cluster"),
    vbuckets: Annotated[int, typer.Option(help="vbuckets of the bucket.")] = 1024,
    manager_port: Annotated[
        int, typer.Option(help="The manager's HTTP port; 0 picks a free one.")
    ] = 0,
    durability_min_level: Annotated[
        str | None,
        typer.Option(
            help="The bucket's minimum durability level on every node (none, majority, "
            "majorityAndPersistActive, persistToMajority): every write a SyncWrite of at "
            "least that level."
        ),
    ] = None,
    durability_timeout_ms: Annotated[
        int | None,
        typer.Option(help="The bucket's timeout of durable writes that name none [30000]."),
    ] = None,
    eviction_policy: Annotated[
        str | None,
        typer.Option(
            help="The bucket's eviction policy on every node: valueOnly or fullEviction "
            "[valueOnly]."
        ),
    ] = None,
    etcd: Annotated[
        bool | None,
        typer.Option(
            "--etcd/--no-etcd",
            help="A manager per node over an etcd cluster (3 members; 1 below 3 nodes) "
            "[default: with 3 nodes or more, when etcd is installed].",
        ),
    ] = None,
    lease_ttl: Annotated[
        int | None,
        typer.Option(
            min=2,
            help="Seconds each manager's etcd lease lasts (--etcd): how long a dead "
            "leader leads before another takes over [10].",
        ),
    ] = None,
) -> None:
    """Start a development cluster on this machine: N managed data nodes and a manager.

    Every process is a child of this command, on free ports, with its data and log under
    --data-dir (node0/, node0.log, ..., manager/, manager.log); it prints where each listens
    and waits. The processes are siblings: a crashed one is reported and takes no other with
    it, and a crashed manager is started again. Ctrl-C or SIGTERM stops the manager and the
    nodes cleanly, by PID. Run it again on the same folder to get the same cluster back, on
    the same ports.
    """
    from dcpkv.cluster.local import LocalCluster, LocalClusterError

    if nodes < 1:
        typer.echo("dcpkv cluster up: --nodes must be at least 1", err=True)
        raise typer.Exit(2)
    node_flags: list[str] = []
    if durability_min_level is not None:
        node_flags += ["--durability-min-level", durability_min_level]
    if durability_timeout_ms is not None:
        node_flags += ["--durability-timeout-ms", str(durability_timeout_ms)]
    if eviction_policy is not None:
        node_flags += ["--eviction-policy", eviction_policy]
    members = _etcd_members(nodes, etcd)
    if lease_ttl is not None and not members:
        typer.echo("dcpkv cluster up: --lease-ttl needs managers on etcd (--etcd)", err=True)
        raise typer.Exit(2)
    manager_flags = () if lease_ttl is None else ("--lease-ttl", str(lease_ttl))
    cluster = LocalCluster(
        data_dir, nodes, replicas, vbuckets, manager_port,
        etcd_members=members, node_flags=tuple(node_flags), manager_flags=manager_flags,
    )  # fmt: skip
    code = 0
    try:
        cluster.start()
        cluster.describe(sys.stdout)
        code = cluster.wait()
    except LocalClusterError as exc:
        typer.echo(f"dcpkv cluster up: {exc}", err=True)
        code = 1
    finally:
        cluster.stop()
    raise typer.Exit(code)

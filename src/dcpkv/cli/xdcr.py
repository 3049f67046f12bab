"""``dcpkv xdcr ...``: remote clusters and replications, through the manager's admin API.

Theory of operation
-------------------
Thin shells, like ``dcpkv cluster``: each command sends one request to the source cluster's
manager (:mod:`dcpkv.cluster.xdcr.service` serves it) and prints the answer (``--json`` for
the raw document). A refusal prints the manager's one-line reason and exits 1.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote

import typer

from dcpkv.cli.options import (
    DEFAULT_MANAGER_URL,
    ClusterAdmin,
    ClusterAdminPassword,
    JsonAnswer,
    ManagerUrl,
    manager_call,
)
from dcpkv.core.defaults import DEFAULT_BUCKET, DEFAULT_PASSWORD, DEFAULT_USER

xdcr_app = typer.Typer(
    help="Cross data centre replication: remote clusters (remote add|list|remove) and "
    "replications (create, pause, resume, delete, status).",
    no_args_is_help=True,
    add_completion=False,
)
remote_app = typer.Typer(help="The clusters this one replicates to.", no_args_is_help=True)
xdcr_app.add_typer(remote_app, name="remote")


def _call(
    url: str, method: str, path: str, user: str, password: str, params: dict[str, str] | None = None
) -> Any:
    return manager_call("xdcr", url, method, path, user, password, params)


Id = Annotated[str, typer.Argument(help="The replication's id: remote/fromBucket/toBucket.")]


@remote_app.command("add")
def remote_add(
    name: Annotated[str, typer.Argument(help="A name for the remote cluster.")],
    hostname: Annotated[str, typer.Option(help="One of its data nodes, host:port.")],
    username: Annotated[str, typer.Option(help="Its user with write access to the bucket.")],
    remote_password: Annotated[str, typer.Option(help="That user's password.")],
    certificate: Annotated[
        str | None, typer.Option(help="A CA file: talk to the remote over TLS.")
    ] = None,
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Add a remote cluster (the target of replications)."""
    params = {"name": name, "hostname": hostname, "username": username,
              "password": remote_password}  # fmt: skip
    if certificate:
        params["certificate"] = certificate
    _call(url, "POST", "/pools/default/remoteClusters", user, password, params)
    typer.echo(f"remote cluster {name} added ({hostname})")


@remote_app.command("list")
def remote_list(
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
    json_: JsonAnswer = False,
) -> None:
    """The remote clusters (without passwords)."""
    doc: Any = _call(url, "GET", "/pools/default/remoteClusters", user, password)
    if json_:
        typer.echo(json.dumps(doc, indent=1))
        return
    for remote in doc:
        tls = " (TLS)" if remote.get("tls_ca") else ""
        typer.echo(f"{remote['name']}  {remote['hostname']}  as {remote['username']}{tls}")


@remote_app.command("remove")
def remote_remove(
    name: Annotated[str, typer.Argument(help="The remote cluster.")],
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Forget a remote cluster (refused while a replication uses it)."""
    _call(url, "DELETE", f"/pools/default/remoteClusters/{quote(name, safe='')}", user, password)
    typer.echo(f"remote cluster {name} removed")


@xdcr_app.command()
def create(
    to_cluster: Annotated[str, typer.Option(help="The remote cluster.")],
    from_bucket: Annotated[str, typer.Option(help="This cluster's bucket.")] = DEFAULT_BUCKET,
    to_bucket: Annotated[str, typer.Option(help="The remote's bucket.")] = DEFAULT_BUCKET,
    filter_expression: Annotated[
        str | None, typer.Option(help="Only keys matching this regular expression.")
    ] = None,
    skip_deletions: Annotated[bool, typer.Option(help="Do not replicate deletions.")] = False,
    skip_expirations: Annotated[bool, typer.Option(help="Do not replicate expirations.")] = False,
    checkpoint_interval: Annotated[
        float | None, typer.Option(help="Seconds between checkpoints [default: 10].")
    ] = None,
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Start replicating a bucket to a remote cluster, continuously."""
    params = {"fromBucket": from_bucket, "toCluster": to_cluster, "toBucket": to_bucket,
              "replicationType": "continuous"}  # fmt: skip
    if filter_expression:
        params["filterExpression"] = filter_expression
    if skip_deletions:
        params["filterSkipDeletions"] = "true"
    if skip_expirations:
        params["filterSkipExpirations"] = "true"
    if checkpoint_interval is not None:
        params["checkpointInterval"] = str(checkpoint_interval)
    doc = _call(url, "POST", "/controller/createReplication", user, password, params)
    typer.echo(f"replication {doc['id']} created")


def _pause(url: str, user: str, password: str, rid: str, paused: bool) -> None:
    path = f"/settings/replications/{quote(rid, safe='')}"
    _call(url, "POST", path, user, password, {"pauseRequested": "true" if paused else "false"})
    typer.echo(f"replication {rid} {'paused' if paused else 'resumed'}")


@xdcr_app.command()
def pause(
    rid: Id,
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Pause a replication (it keeps its checkpoints)."""
    _pause(url, user, password, rid, paused=True)


@xdcr_app.command()
def resume(
    rid: Id,
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Resume a paused replication from its checkpoints."""
    _pause(url, user, password, rid, paused=False)


@xdcr_app.command()
def delete(
    rid: Id,
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Stop a replication and forget it."""
    _call(url, "DELETE", f"/controller/cancelXDCR/{quote(rid, safe='')}", user, password)
    typer.echo(f"replication {rid} deleted")


@xdcr_app.command()
def status(
    url: ManagerUrl = DEFAULT_MANAGER_URL,
    user: ClusterAdmin = DEFAULT_USER,
    password: ClusterAdminPassword = DEFAULT_PASSWORD,
    json_: JsonAnswer = False,
) -> None:
    """Each replication: running or paused, changes left, docs written, conflicts lost at
    the source and at the target, rate, restarts."""
    doc: Any = _call(url, "GET", "/pools/default/tasks", user, password)
    if json_:
        typer.echo(json.dumps(doc, indent=1))
        return
    if not doc:
        typer.echo("no replications")
    for task in doc:
        s = task.get("stats", {})
        typer.echo(
            f"{task['id']}  {task['status']}  changes_left={s.get('changes_left', '?')}  "
            f"docs_written={s.get('docs_written', 0)}  "
            f"docs_failed_cr_source={s.get('docs_failed_cr_source', 0)}  "
            f"docs_failed_cr_target={s.get('docs_failed_cr_target', 0)}  "
            f"docs_filtered={s.get('docs_filtered', 0)}  "
            f"rate={s.get('rate_docs_per_s', 0)}/s  restarts={task.get('restarts', 0)}"
        )
        if task.get("lastError"):
            typer.echo(f"  last error: {task['lastError']}")

"""The options several commands share, declared once: where the node is and who connects
(``--host``, ``--port``, ``--bucket``, ``--user``, ``--password``, ``--tls``, ``--tls-ca``),
the Spark master of the commands that run a Spark job, ``--durability`` of the commands
that write, and the cluster manager's admin API (``--url``, ``--user``, ``--password``,
``--json``) of the commands that send it one request each (:func:`manager_call`).

A command declares ``host: Host = DEFAULT_HOST`` and so on, and turns them into the client's
settings with :func:`connection_settings`; the client library is imported only then, so that
``--help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dcpkv.core.defaults import DEFAULT_HOST
from dcpkv.core.tls import TlsSettings

if TYPE_CHECKING:
    from dcpkv.client.settings import ConnectionSettings

Host = Annotated[
    str, typer.Option(help="Server address, or a connection string: couchbase://h1,h2:11210.")
]
Port = Annotated[int, typer.Option(help="Server port.")]
Bucket = Annotated[str, typer.Option(help="Bucket.")]
User = Annotated[str, typer.Option(help="User name.")]
Password = Annotated[str, typer.Option(help="Its password.")]
Tls = Annotated[
    bool,
    typer.Option("--tls", help="Speak TLS (then --port is the node's TLS port, e.g. 11207)."),
]
TlsCa = Annotated[
    Path | None,
    typer.Option(help="With --tls: the CA certificate to trust [default: the system's]."),
]
DurabilityLevel = Annotated[
    str,
    typer.Option(
        help="Every write a SyncWrite committed at this level before it counts: none, "
        "majority, majorityAndPersistActive or persistToMajority (the bucket's vbuckets need "
        "a replication topology: a cluster's manager sets them)."
    ),
]
Master = Annotated[
    str | None, typer.Option(help="Spark master [default: $DCPKV_SPARK_MASTER or local[*]].")
]


def tls_options(tls: bool, ca: Path | None) -> TlsSettings | None:
    if not tls:
        if ca is not None:
            raise typer.BadParameter("--tls-ca needs --tls")
        return None
    return TlsSettings(ca=str(ca) if ca is not None else None)


def durability_level(text: str) -> str:
    """``text`` checked as a level name (BadParameter otherwise), as given."""
    from dcpkv.client.durability import parse_durability

    try:
        parse_durability(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--durability") from None
    return text


def connection_settings(
    host: str, port: int, bucket: str, user: str, password: str, tls: bool, tls_ca: Path | None
) -> ConnectionSettings:
    """The client's settings from the shared options (a bad address raises ``NodeAddressError``)."""
    from dcpkv.client.settings import ConnectionSettings

    return ConnectionSettings.at(
        host, port, bucket=bucket, user=user, password=password, tls=tls_options(tls, tls_ca)
    )


LogLevel = Annotated[
    str, typer.Option(help="Log lines at this level and above: debug, info, warning or error.")
]
LogFormat = Annotated[
    str,
    typer.Option(help="Log lines as text, or json (one object a line, events with their fields)."),
]

DEFAULT_MANAGER_PORT = 8091  # Couchbase's REST port
DEFAULT_MANAGER_URL = f"http://{DEFAULT_HOST}:{DEFAULT_MANAGER_PORT}"
ManagerUrl = Annotated[
    str, typer.Option(help="The manager's admin API.", envvar="DCPKV_MANAGER_URL")
]
ClusterAdmin = Annotated[str, typer.Option(help="The cluster admin.")]
ClusterAdminPassword = Annotated[str, typer.Option(help="Its password.")]
JsonAnswer = Annotated[bool, typer.Option("--json", help="Print the manager's JSON answer.")]


def manager_call(
    command: str,
    url: str,
    method: str,
    path: str,
    user: str,
    password: str,
    params: dict[str, str] | None = None,
) -> Any:
    """One admin API request; a refusal prints ``dcpkv COMMAND: reason`` and exits 1."""
    from dcpkv.cluster.admin_client import AdminError, admin_request

    try:
        return admin_request(url, method, path, user=user, password=password, params=params)
    except AdminError as exc:
        typer.echo(f"dcpkv {command}: {exc}", err=True)
        raise typer.Exit(1) from None

"""The options several commands share, declared once: where the node is and who connects
(``--host``, ``--port``, ``--bucket``, ``--user``, ``--password``, ``--tls``, ``--tls-ca``),
and the Spark master of the commands that run a Spark job.

A command declares ``host: Host = DEFAULT_HOST`` and so on, and turns them into the client's
settings with :func:`connection_settings`; the client library is imported only then, so that
``--help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dcpkv.core.tls import TlsOptions

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
Master = Annotated[
    str | None, typer.Option(help="Spark master [default: $DCPKV_SPARK_MASTER or local[*]].")
]


def tls_options(tls: bool, ca: Path | None) -> TlsOptions | None:
    if not tls:
        if ca is not None:
            raise typer.BadParameter("--tls-ca needs --tls")
        return None
    return TlsOptions(ca=str(ca) if ca is not None else None)


def connection_settings(
    host: str, port: int, bucket: str, user: str, password: str, tls: bool, tls_ca: Path | None
) -> ConnectionSettings:
    """The client's settings from the shared options (a bad address raises ``NodeAddressError``)."""
    from dcpkv.client.settings import ConnectionSettings

    return ConnectionSettings.at(
        host, port, bucket=bucket, user=user, password=password, tls=tls_options(tls, tls_ca)
    )

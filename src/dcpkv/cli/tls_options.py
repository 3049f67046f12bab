"""The TLS options every client command takes (``--tls``, ``--tls-ca``), in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dcpkv.core.tls import TlsOptions

Tls = Annotated[
    bool,
    typer.Option("--tls", help="Speak TLS (then --port is the node's TLS port, e.g. 11207)."),
]
TlsCa = Annotated[
    Path | None,
    typer.Option(help="With --tls: the CA certificate to trust [default: the system's]."),
]


def tls_options(tls: bool, ca: Path | None) -> TlsOptions | None:
    if not tls:
        if ca is not None:
            raise typer.BadParameter("--tls-ca needs --tls")
        return None
    return TlsOptions(ca=str(ca) if ca is not None else None)

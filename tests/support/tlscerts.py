"""Certificates made for a test with the ``openssl`` command (no private key is committed).

:func:`make_certs` writes a throw-away CA, a server certificate for 127.0.0.1 and localhost,
and a client certificate, all signed by that CA, into a folder.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed none of these


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(folder: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN=dcpkv test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)  # fmt: skip


def _signed(folder: Path, name: str, ext: str) -> None:
    (folder / f"{name}.ext").write_text(ext)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN=dcpkv test {name}", cwd=folder)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
             "-extfile", f"{name}.ext", cwd=folder)  # fmt: skip


def make_certs(folder: Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    folder.mkdir(parents=True, exist_ok=True)
    _ca(folder, "ca")
    _ca(folder, "other")
    _signed(folder, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth\n")  # fmt: skip
    _signed(folder, "client", "extendedKeyUsage=clientAuth\n")
    return Certs(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        other_ca=folder / "other.pem",
    )


def sdk_cluster(tls_port: int, ca: Path) -> Any:
    """The official SDK connected with ``couchbases://`` to a TLS port, trusting ``ca``."""
    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster
    from couchbase.options import ClusterOptions, ClusterTimeoutOptions

    timeouts = ClusterTimeoutOptions(
        kv_timeout=timedelta(seconds=5),
        connect_timeout=timedelta(seconds=10),
        bootstrap_timeout=timedelta(seconds=10),
    )
    auth = PasswordAuthenticator("Administrator", "password", cert_path=str(ca))
    options = ClusterOptions(auth, timeout_options=timeouts)
    return Cluster(f"couchbases://127.0.0.1:{tls_port}", options)

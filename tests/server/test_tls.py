"""TLS on the data port's twin (``--tls-port``) against real processes, with certificates
made for the test: the client library, the commands, the official SDK (``couchbases://``),
and client certificates (``--tls-ca``)."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.client.blocking import BlockingKV, RequestFailed
from dcpkv.client.settings import ConnectionSettings
from dcpkv.core.status import Status
from dcpkv.core.tls import TlsSettings
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.serverproc import ServerProcess, tracked_servers
from support.tlscerts import Certs, make_certs, sdk_cluster


def dcpkv(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dcpkv.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_args(certs: Certs, *extra: str) -> tuple[str, ...]:
    return ("--tls-port", "0", "--tls-cert", str(certs.server_cert),
            "--tls-key", str(certs.server_key), *extra)  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tls")
    with tracked_servers() as factory:
        srv = factory(root / "data", root / "server.log", *tls_args(certs))
        srv.start()
        assert srv.tls_port and srv.tls_port != srv.port
        done = dcpkv("user", "add", "streamer", "--role", "data_dcp_reader[default]",
                     "--password", "s-pw", "--data-dir", str(srv.data_dir))  # fmt: skip
        assert done.returncode == 0, done.stderr
        yield srv


def settings(server: ServerProcess, tls: TlsSettings, **kw: str) -> ConnectionSettings:
    return ConnectionSettings.at("127.0.0.1", server.tls_port, tls=tls, **kw)


def test_the_client_library_speaks_tls(server: ServerProcess, certs: Certs) -> None:
    with BlockingKV.connect(settings(server, TlsSettings(ca=str(certs.ca)))) as kv:
        assert isinstance(kv.sock, ssl.SSLSocket)
        kv.call(Opcode.Set, key=b"tls-doc", value=b'{"a":1}', extras=b"\0" * 8)
        assert bytes(kv.call(Opcode.Get, key=b"tls-doc").value) == b'{"a":1}'
    with BlockingKV.connect(ConnectionSettings.at("127.0.0.1", server.port)) as plain:
        assert bytes(plain.call(Opcode.Get, key=b"tls-doc").value) == b'{"a":1}'


def test_an_untrusted_server_certificate_is_refused(server: ServerProcess, certs: Certs) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        BlockingKV.connect(settings(server, TlsSettings(ca=str(certs.other_ca))))
    # the name is checked too: the certificate names 127.0.0.1 and localhost only
    context = TlsSettings(ca=str(certs.ca)).context()
    with (
        socket.create_connection(("127.0.0.1", server.tls_port), timeout=10) as sock,
        pytest.raises(ssl.SSLCertVerificationError, match="mismatch"),
    ):
        context.wrap_socket(sock, server_hostname="db.example.com")


def test_commands_over_tls_with_a_least_privilege_user(server: ServerProcess, certs: Certs) -> None:
    common = ("--port", str(server.tls_port), "--tls", "--tls-ca", str(certs.ca),
              "--user", "streamer", "--password", "s-pw")  # fmt: skip
    with BlockingKV.connect(settings(server, TlsSettings(ca=str(certs.ca)))) as kv:
        kv.call(Opcode.Set, key=b"streamed", value=b"{}", extras=b"\0" * 8)
    streamed = dcpkv("stream", "--to", "now", *common)
    assert streamed.returncode == 0, streamed.stderr
    assert "streamed" in {json.loads(line)["key"] for line in streamed.stdout.splitlines()}
    stats = dcpkv("stats", *common)
    assert stats.returncode == 0 and "curr_items" in stats.stdout
    refused = dcpkv("stats", "--port", str(server.tls_port), "--tls", "--tls-ca",
                    str(certs.other_ca))  # fmt: skip
    assert refused.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in refused.stderr
    with BlockingKV.connect(
        settings(server, TlsSettings(ca=str(certs.ca)), user="streamer", password="s-pw")
    ) as kv:
        with pytest.raises(RequestFailed) as refusal:
            kv.call(Opcode.Set, key=b"nope", value=b"{}", extras=b"\0" * 8)
        assert refusal.value.status == Status.Eaccess


def test_the_official_sdk_over_tls(server: ServerProcess, certs: Certs) -> None:
    cluster = sdk_cluster(server.tls_port, certs.ca)
    try:
        coll = cluster.bucket("default").default_collection()
        coll.upsert("sdk-tls", {"over": "tls"})
        assert coll.get("sdk-tls").content_as[dict] == {"over": "tls"}
    finally:
        cluster.close()
    with BlockingKV.connect(ConnectionSettings.at("127.0.0.1", server.port)) as plain:
        got = plain.call(Opcode.Get, key=b"sdk-tls", vbucket=vbucket_for_key(b"sdk-tls", 16))
        assert json.loads(bytes(got.value)) == {"over": "tls"}


def test_client_certificates_are_required_with_a_ca(tmp_path: Path, certs: Certs) -> None:
    with tracked_servers() as factory:
        srv = factory(tmp_path / "data", tmp_path / "server.log",
                      *tls_args(certs, "--tls-ca", str(certs.ca)))  # fmt: skip
        srv.start()
        without = settings(srv, TlsSettings(ca=str(certs.ca)))
        # OSError covers SSLError and a reset; with TLS 1.3 the refusal comes at the first read
        with pytest.raises(OSError), BlockingKV.connect(without) as kv:
            kv.stats()
        with_cert = TlsSettings(ca=str(certs.ca), cert=str(certs.client_cert),
                               key=str(certs.client_key))  # fmt: skip
        with BlockingKV.connect(settings(srv, with_cert)) as kv:
            assert kv.stats()


def test_bad_tls_settings_are_clear_errors(tmp_path: Path, certs: Certs) -> None:
    missing = dcpkv("server", "--port", "0", "--data-dir", str(tmp_path / "d"),
                    "--tls-port", "0", "--tls-cert", str(tmp_path / "nope.pem"),
                    "--tls-key", str(certs.server_key))  # fmt: skip
    assert missing.returncode == 1 and "no such certificate or key file" in missing.stderr
    half = dcpkv("server", "--port", "0", "--data-dir", str(tmp_path / "d"), "--tls-port", "0")
    assert half.returncode == 2 and "TLS needs all of" in half.stderr

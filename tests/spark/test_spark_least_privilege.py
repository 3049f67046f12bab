"""The Spark source and sink with least-privilege users, over TLS, against a real server: a
data_dcp_reader streams every change but cannot write; a data_writer can."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sparkhelp import Changelog, Workload, server_docs, stream_available_now

from support.serverproc import ServerProcess
from support.tlscerts import make_certs


def add_user(data_dir: Path, name: str, role: str) -> None:
    argv = [sys.executable, "-m", "dcpkv.cli.main", "user", "add", name, "--role", role,
            "--password", f"{name}-pw", "--data-dir", str(data_dir)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_dcp_reader_streams_over_tls_but_cannot_write(
    spark: Any, server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    certs = make_certs(tmp_path / "certs")
    server = server_factory(tmp_path / "data", tmp_path / "server.log", "--vbuckets", "8",
                            "--tls-port", "0", "--tls-cert", str(certs.server_cert),
                            "--tls-key", str(certs.server_key))  # fmt: skip
    add_user(server.data_dir, "streamer", "data_dcp_reader[default]")
    add_user(server.data_dir, "loader", "data_writer[default]")
    server.start()
    work = Workload(server.port)
    work.run(300)
    truth = work.truth()
    log = Changelog()
    tls = {"tls": "true", "tlsCa": str(certs.ca)}
    stream_available_now(spark, server.tls_port, tmp_path / "ck", log,
                         user="streamer", password="streamer-pw", **tls)  # fmt: skip
    assert log.live() == truth and len(truth) > 10

    rows = [(f"sunk-{i}", b"body", 0, "mutation") for i in range(20)]
    df = spark.createDataFrame(rows, "key STRING, value BINARY, flags BIGINT, op STRING")
    writer = df.coalesce(1).write.format("dcpkv").option("port", server.tls_port).options(**tls)
    with pytest.raises(Exception, match="Eaccess"):
        writer.option("user", "streamer").option("password", "streamer-pw").mode("append").save()
    writer.option("user", "loader").option("password", "loader-pw").mode("append").save()
    keys = {f"sunk-{i}".encode() for i in range(20)}
    assert server_docs(server.port, keys) == dict.fromkeys(keys, b"body")

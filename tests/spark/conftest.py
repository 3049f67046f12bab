"""ONE local SparkSession for every Spark test, and real ``dcpkv server`` processes.

Spark takes seconds to start, so the session is shared (session scope) and stopped once at
the end. Servers are per test, with 8 vbuckets, and are stopped by PID at teardown (SIGTERM,
then SIGKILL) whatever the test did to them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dcpkv.spark
from support.serverproc import ServerProcess, tracked_servers


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("dcpkv-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    dcpkv.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def server_factory() -> Iterator[type[ServerProcess]]:
    with tracked_servers() as factory:
        yield factory


@pytest.fixture
def server(server_factory: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", "--vbuckets", "8")
    srv.start()
    return srv

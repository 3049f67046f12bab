"""The main job's pieces without Spark: the node subprocess, the sample load, the generator."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.app.node import LocalNode, NodeStartError
from dcpkv.client.durability import Durability, ServerDurability, SyncWriteImpossibleError
from dcpkv.client.settings import ConnectionSettings
from dcpkv.pipelines.loader import (
    MARKER_KEY,
    ChangeGenerator,
    SampleInfo,
    bucket_vbuckets,
    load_sample,
    loaded_sample,
)
from support.topology import alone, set_topologies

VBUCKETS = 8


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LocalNode]:
    node = LocalNode(tmp_path / "data", tmp_path / "logs" / "server.log", port=0, num_vbuckets=8)
    node.start()
    yield node
    node.stop()


def endpoint(node: LocalNode) -> ConnectionSettings:
    return ConnectionSettings.at(port=node.port)


def test_node_starts_on_a_free_port_and_stops_cleanly(node: LocalNode) -> None:
    pid = node.pid
    assert pid is not None and node.port > 0
    assert bucket_vbuckets(endpoint(node)) == (VBUCKETS, 0)
    assert node.stop() == 0
    assert not pid_alive(pid)
    assert "stopped cleanly" in node.log_path.read_text()
    assert node.stop() == 0  # idempotent


def test_a_taken_port_is_reported_with_the_way_out(node: LocalNode, tmp_path: Path) -> None:
    other = LocalNode(tmp_path / "other", tmp_path / "other.log", port=node.port)
    with pytest.raises(NodeStartError, match=r"already taken.*--port"):
        other.start()
    assert other.proc is None


def test_a_server_that_cannot_start_explains_why(node: LocalNode, tmp_path: Path) -> None:
    # Same data dir, another port: the bucket is locked by the first server.
    twin = LocalNode(node.data_dir, tmp_path / "twin.log", port=0, num_vbuckets=8)
    with pytest.raises(NodeStartError, match="exited with status 1"):
        twin.start()


def test_the_cli_refuses_a_taken_port(node: LocalNode, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "dcpkv.cli.main", "demo", "--port", str(node.port),
           "--data-dir", str(tmp_path / "demo")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"port {node.port}" in done.stdout and "--port" in done.stdout


def test_sample_loads_once_with_a_marker(node: LocalNode) -> None:
    ep = endpoint(node)
    assert loaded_sample(ep, VBUCKETS) is None
    progress: list[int] = []
    assert load_sample(ep, VBUCKETS, 5000, seed=3, on_progress=progress.append)
    assert sum(progress) == 5000
    assert loaded_sample(ep, VBUCKETS) == SampleInfo(docs=5000, seed=3)
    assert bucket_vbuckets(ep) == (VBUCKETS, 5001)  # the documents and the marker


def test_an_interrupted_load_leaves_no_marker(node: LocalNode) -> None:
    ep = endpoint(node)
    assert not load_sample(ep, VBUCKETS, 10_000, should_stop=lambda: True)
    assert loaded_sample(ep, VBUCKETS) is None
    assert 0 < bucket_vbuckets(ep)[1] < 10_000
    assert MARKER_KEY.startswith(b"_")  # sorts apart from the sample's type::N keys


def test_generator_writes_until_stopped(node: LocalNode) -> None:
    ep = endpoint(node)
    load_sample(ep, VBUCKETS, 500)
    generator = ChangeGenerator(ep, VBUCKETS, 500, rate=2000, seed=1)
    run_until(generator, 300)
    assert not generator.is_alive()
    assert generator.error is None and generator.written >= 300


def run_until(generator: ChangeGenerator, written: int) -> None:
    """Run ``generator`` until it wrote ``written`` changes (30 s at most), then stop it."""
    generator.start()
    for _ in range(300):
        if generator.written >= written:
            break
        generator.join(0.1)
    generator.stop()


def test_a_durable_load_and_generator_on_a_single_node_topology(node: LocalNode) -> None:
    """``durability``: the load and the generator write SyncWrites (committed at
    persistToMajority on vbuckets with a single-node topology); without a topology the load
    is refused at once, nothing written."""
    ep = endpoint(node)
    with pytest.raises(SyncWriteImpossibleError):
        load_sample(ep, VBUCKETS, 100, durability=Durability.MAJORITY)
    assert bucket_vbuckets(ep) == (VBUCKETS, 0)
    set_topologies(node.port, alone(node.port, range(VBUCKETS)))
    level = ServerDurability(Durability.PERSIST_TO_MAJORITY, 10.0)
    assert load_sample(ep, VBUCKETS, 300, seed=3, durability=level)
    assert bucket_vbuckets(ep) == (VBUCKETS, 301)
    generator = ChangeGenerator(ep, VBUCKETS, 300, rate=2000, seed=1, durability=level)
    run_until(generator, 100)
    assert generator.error is None and generator.written >= 100

"""The main job on a local cluster with chaos: ``dcpkv demo --nodes 3 --replicas 1 --chaos``.

One short run as a subprocess (3 managed nodes, the manager and a Spark of its own): a node
is killed every few seconds, the manager fails it over after one second, the demo restarts
it and takes it back with delta recovery. The demo's own end check (the mirror and the view
against the bucket, read through the cluster) must pass, at least one failover and one
recovery must have happened, and every process must be gone afterwards. Kept short (a
kill every 1.5-2.5 s for 5 s, 1,000 documents, 16 vbuckets): the wall time is mostly Spark's.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dcpkv.app.chaos import parse_every

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_TIMEOUT_S = 240


def test_chaos_demo_on_three_nodes_ends_equal_after_failovers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cmd = [
        sys.executable, "-m", "dcpkv.cli.main", "demo", "--data-dir", str(data),
        "--docs", "1000", "--vbuckets", "16", "--rate", "100", "--nodes", "3",
        "--replicas", "1", "--chaos", "--chaos-every", "1.5-2.5", "--failover-timeout", "1",
        "--duration", "5",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "End check passed: the mirror equals the bucket" in out, out
    assert "the view equals the map of the bucket" in out
    final = re.search(r"Final: .*chaos: (\d+) kills, (\d+) failovers, (\d+) recovered", out)
    assert final, out
    assert int(final.group(2)) >= 1 and int(final.group(3)) >= 1, final.group(0)
    assert re.search(r"chaos \S+ failover 127\.0\.0\.1:\d+", out)
    assert re.search(r"chaos \S+ recovered 127\.0\.0\.1:\d+", out)
    assert "Cluster stopped (exit statuses [0, 0, 0, 0])" in out
    up = re.search(r"Cluster up: couchbase://(\S+),", out)
    assert up, out
    for node in up.group(1).split(","):  # every node is gone
        host, port = node.rsplit(":", 1)
        with socket.socket() as sock:
            assert sock.connect_ex((host, int(port))) != 0
    assert (data / "pipelines" / "report.png").read_bytes()[:8] == PNG_MAGIC


def test_chaos_without_a_cluster_is_refused(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "dcpkv.cli.main", "demo", "--chaos", "--data-dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--chaos needs a cluster with replicas" in done.stderr


@pytest.mark.parametrize(
    ("text", "every"), [("20-40", (20.0, 40.0)), ("3", (3.0, 3.0)), ("0.5-1.5", (0.5, 1.5))]
)
def test_chaos_every_reads_a_range_or_one_value(text: str, every: tuple[float, float]) -> None:
    assert parse_every(text) == every


@pytest.mark.parametrize("text", ["", "a-b", "40-20", "0", "-3"])
def test_chaos_every_refuses_what_is_not_a_range(text: str) -> None:
    with pytest.raises(ValueError):
        parse_every(text)

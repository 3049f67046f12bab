"""The main job end to end: ``dcpkv demo`` as a subprocess with its own Spark.

Each test starts a whole demo (a server and a Spark of its own: about ten seconds of
start-up), so there are two: a timed run whose end state is checked (the mirror equals the
bucket, the view answers, the report is a PNG), and a Ctrl-C (SIGINT to the whole process
group, as a terminal sends it) on a data dir that already holds the sample (the load is
skipped). The end state is read with the suite's one SparkSession from a server restarted on
the demo's data dir.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dcpkv.app.node import LocalNode
from dcpkv.client.settings import ConnectionSettings
from dcpkv.pipelines.loader import load_sample
from support.serverproc import ServerProcess

VBUCKETS = 16
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_TIMEOUT_S = 240


def demo_cmd(data_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "dcpkv.cli.main", "demo", "--port", "0", "--data-dir",
        str(data_dir), "--docs", "2000", "--vbuckets", str(VBUCKETS), *extra,
    ]  # fmt: skip


def node_pid(output: str) -> int:
    found = re.search(r"Node up: 127\.0\.0\.1:\d+ \(pid (\d+)\)", output)
    assert found, output
    return int(found.group(1))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def documents_of(rows: list[Any]) -> dict[bytes, bytes]:
    return {bytes(r.key): bytes(r.value) for r in rows}


def test_demo_runs_then_stops_with_the_mirror_equal_to_the_bucket(
    spark: Any, server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    from dcpkv.pipelines.mirror import read_mirror
    from dcpkv.pipelines.views import query_view

    data = tmp_path / "data"
    done = subprocess.run(
        demo_cmd(data, "--duration", "10"), capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "Loaded 2,000 documents" in out
    assert "Where to look" in out and "dcpkv view query revenue_by_country --group" in out
    assert "dcpkv stream --to now" in out
    assert not pid_alive(node_pid(out))
    assert re.search(r"Stopped after [1-9][\d,]* changes", out), out
    report = data / "pipelines" / "report.png"
    assert str(report) in out.replace("\n", "")
    assert report.read_bytes()[:8] == PNG_MAGIC

    server = server_factory(data, tmp_path / "server.log", "--vbuckets", str(VBUCKETS))
    port = server.start()
    bucket = spark.read.format("dcpkv").option("port", port).option("mode", "documents").load()
    truth = documents_of(bucket.collect())
    assert len(truth) > 2000 * 0.9
    assert documents_of(read_mirror(spark, data / "pipelines" / "mirror").collect()) == truth
    groups = query_view(spark, data / "pipelines" / "views", "revenue_by_country", group=True)
    assert groups and all(isinstance(g, dict) for g in groups)


def test_ctrl_c_stops_everything_and_a_rerun_skips_the_load(tmp_path: Path) -> None:
    data = tmp_path / "data"
    node = LocalNode(data, tmp_path / "preload.log", port=0, num_vbuckets=VBUCKETS)
    node.start()
    try:
        ep = ConnectionSettings.at(port=node.port)
        assert load_sample(ep, VBUCKETS, 2000)
    finally:
        assert node.stop() == 0

    proc = subprocess.Popen(
        demo_cmd(data), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        seen = read_until(proc, "Ctrl-C stops everything")
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        rest, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = seen + rest
    assert proc.returncode == 0, out
    assert "already holds the sample (2,000 documents" in out
    assert "SIGINT: stopping cleanly" in out
    pid = node_pid(out)
    assert f"Node stopped (pid {pid}, exit status 0)" in out
    assert not pid_alive(pid)


def read_until(proc: subprocess.Popen[str], marker: str) -> str:
    """stdout up to the line holding ``marker``; fails if the demo exits or takes too long."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for line in proc.stdout:  # bounded by the demo's output, and the deadline below
        seen.append(line)
        if marker in line:
            return "".join(seen)
        if time.monotonic() > deadline:
            break
    pytest.fail("the demo never printed " + repr(marker) + ":\n" + "".join(seen))

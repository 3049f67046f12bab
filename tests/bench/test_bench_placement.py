"""Where a benchmark's processes run (``bench/_placement.py``): the client on one CPU, the
servers it starts on the others. The pinning runs in a child Python, so pytest's own
affinity stays as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _placement  # noqa: E402  (bench/ is a folder of scripts, not a package)

SPLITS = [
    ({0}, {0}, {0}),  # one CPU: nothing to split, both sides share it
    ({0, 1}, {0}, {1}),
    ({0, 1, 2, 3}, {0}, {1, 2, 3}),
    ({2, 5}, {2}, {5}),  # a cgroup's CPUs need not start at 0
]


@pytest.mark.parametrize(("cpus", "client", "servers"), SPLITS)
def test_the_client_gets_the_lowest_cpu_and_the_servers_the_rest(
    cpus: set[int], client: set[int], servers: set[int]
) -> None:
    assert _placement._split(cpus) == (client, servers)


# In a child: pin the client, start a real server and a process "everywhere", and report
# every thread's CPUs as JSON.
_CHILD = """
import json, os, subprocess, sys, time
sys.path.insert(0, {bench!r})
import _placement
from _server import bench_server_proc

pinned = _placement.pin_client()
with _placement.everywhere():
    free = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
with bench_server_proc(16, label="placement") as (port, pid):
    time.sleep(0.5)  # its threads (flusher, the loop's) are started by now
    threads = [sorted(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{{pid}}/task")]
    report = {{"pinned": pinned, "client": sorted(os.sched_getaffinity(0)),
              "server_threads": threads, "everywhere": sorted(os.sched_getaffinity(free.pid)),
              "pool": _placement.server_threads(4)}}
free.kill()
print(json.dumps(report))
"""


def _run_child(env: dict[str, str]) -> dict[str, object]:
    code = _CHILD.format(bench=str(BENCH))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing is pinned")
def test_a_benchmark_s_server_runs_every_thread_on_the_server_cpus_and_the_client_on_its_own(
) -> None:  # fmt: skip
    mine = sorted(os.sched_getaffinity(0))
    report = _run_child({_placement.ENV: "on"})
    assert report["pinned"] is True
    assert report["client"] == mine[:1]
    threads = report["server_threads"]
    assert isinstance(threads, list) and len(threads) > 1
    assert all(t == mine[1:] for t in threads), threads
    assert report["everywhere"] == mine
    assert report["pool"] == len(mine) - 1  # memcached's -t: one worker per server CPU


def test_placement_off_pins_nothing() -> None:
    mine = sorted(os.sched_getaffinity(0))
    report = _run_child({_placement.ENV: "off"})
    assert report["pinned"] is False
    assert report["client"] == mine
    assert report["everywhere"] == mine
    assert all(t == mine for t in report["server_threads"])  # type: ignore[attr-defined]
    assert report["pool"] == 4  # the server's own default

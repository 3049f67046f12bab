"""Structured logs (dcpkv.core.logs) from real processes: a cluster's manager and nodes run
with ``--log-format json``; an auth failure on a node and on the manager, a failover and a
rebalance each leave one JSON line with their event and fields, every line parses, and
``--log-level warning`` hides the info events but not the warnings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dcpkv.cluster.admin_client import AdminError, admin_request
from dcpkv.core.status import Status
from support.kvclient import KVClient
from support.managerproc import ManagerProcess, start_cluster, wait_for
from support.rebalancecheck import rebalance
from support.serverproc import ServerProcess

JSON_LOGS = ("--log-format", "json")


def lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON log (each must parse)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(path: Path, name: str) -> list[dict[str, Any]]:
    return [line for line in lines(path) if line.get("event") == name]


def test_failover_rebalance_and_auth_failures_are_logged_as_json_events(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(
        server_factory, manager_factory, tmp_path, nodes=3, replicas=1,
        node_args=JSON_LOGS, manager_args=JSON_LOGS,
    )  # fmt: skip
    manager, victim = cluster.manager, cluster.nodes[0]
    node_log = tmp_path / "n1.log"
    with KVClient(cluster.nodes[1].port) as kv:
        assert kv.login("Administrator", "not-the-password").status == Status.AuthError
    wait_for(lambda: bool(events(node_log, "auth_failure")), "the node's auth_failure line")
    (node_line,) = events(node_log, "auth_failure")
    assert node_line["level"] == "warning" and node_line["peer"] == "127.0.0.1"
    assert node_line["logger"] == "dcpkv.server" and "Administrator" in node_line["reason"]
    with pytest.raises(AdminError):
        admin_request(manager.url, "GET", "/pools/default", user="Administrator", password="x")
    manager_log = tmp_path / "manager.log"
    wait_for(lambda: bool(events(manager_log, "auth_failure")), "the manager's auth_failure")
    assert events(manager_log, "auth_failure")[0]["path"] == "/pools/default"
    victim.kill9()
    manager.api("POST", "/controller/failOver", otpNode=cluster.name(victim))
    (failover,) = events(manager_log, "failover")
    assert failover["node"] == cluster.name(victim) and failover["automatic"] is False
    assert failover["promoted"] > 0 and failover["level"] == "warning"
    assert rebalance(manager)["state"] == "idle"
    wait_for(lambda: bool(events(manager_log, "rebalance_end")), "the rebalance's end line")
    (start,) = events(manager_log, "rebalance_start")
    (end,) = events(manager_log, "rebalance_end")
    steps = events(manager_log, "rebalance_step")
    assert end["result"] == "done" and len(steps) == start["moves"]
    assert {s["result"] for s in steps} == {"done"}
    assert all(isinstance(line["message"], str) for line in lines(manager_log))


def test_the_log_level_hides_lines_below_it_and_a_bad_one_is_refused(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    node = server_factory(tmp_path / "data", tmp_path / "node.log", "--log-level", "warning",
                          *JSON_LOGS)  # fmt: skip
    node.start()
    with KVClient(node.port) as kv:
        assert kv.login("Administrator", "wrong").status == Status.AuthError
    wait_for(lambda: bool(events(tmp_path / "node.log", "auth_failure")), "the warning")
    assert {line["level"] for line in lines(tmp_path / "node.log")} <= {"warning", "error"}
    bad = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "server", "--log-level", "chatty"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "log level must be one of" in bad.stderr

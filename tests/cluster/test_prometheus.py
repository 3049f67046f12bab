"""Prometheus over a real cluster: the manager's ``/metrics`` (its login and the
``stats_export`` privilege), ``/prometheus_sd_config``, ``promtool check metrics`` over the
manager's and a node's text, and a real Prometheus server on loopback that finds every node
through the manager, scrapes them during a rebalance and a failover, and answers PromQL."""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER
from support.managerproc import Cluster, ManagerProcess, client, start_cluster, wait_for
from support.promcheck import promtool_check, samples
from support.rebalancecheck import Load, rebalance
from support.serverproc import ServerProcess

READER, READER_PASSWORD = "prometheus", "scrape-secret"


def get(url: str, user: str | None = None, password: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def metrics_port(node: ServerProcess) -> int:
    with client(node) as kv:
        return int(kv.stats()["metrics_port"])


class Prometheus:
    """A ``prometheus`` process on a free loopback port with its own config and storage."""

    def __init__(self, tmp: Path, manager_url: str) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is missing: apt-get install prometheus (make test does)")
        self.port = free_port()
        auth = {"username": READER, "password": READER_PASSWORD}
        config = {  # (JSON is YAML)
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "dcpkv",
                    "basic_auth": auth,
                    "http_sd_configs": [
                        {
                            "url": f"{manager_url}/prometheus_sd_config",
                            "refresh_interval": "2s",
                            "basic_auth": auth,
                        }
                    ],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        self.log_path = tmp / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary, f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                ],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        wait_for(self._ready, "prometheus to be ready", timeout_s=60)

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text(errors="replace")
        try:
            return get(f"http://127.0.0.1:{self.port}/-/ready")[0] == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        status, body = get(url)
        assert status == 200, body
        doc = json.loads(body)
        assert doc["status"] == "success", doc
        return list(doc["data"]["result"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def prometheus_factory() -> Iterator[list[Prometheus]]:
    """Every Prometheus a test started, stopped by PID at teardown."""
    started: list[Prometheus] = []
    yield started
    for server in started:
        server.stop()


def monitored_cluster(
    servers: type[ServerProcess], managers: type[ManagerProcess], tmp: Path
) -> Cluster:
    """3 nodes serving metrics, and a user for Prometheus with external_stats_reader."""
    cluster = start_cluster(
        servers, managers, tmp, nodes=3, replicas=1, node_args=("--metrics-port", "0")
    )
    cluster.manager.api(
        "PUT", f"/settings/rbac/users/local/{READER}", password=READER_PASSWORD,
        roles="external_stats_reader",
    )  # fmt: skip
    return cluster


def test_the_managers_metrics_need_a_login_with_stats_export(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = monitored_cluster(server_factory, manager_factory, tmp_path)
    manager = cluster.manager
    manager.api("PUT", "/settings/rbac/users/local/reader", password="pw", roles="data_reader[*]")
    url = f"{manager.url}/metrics"
    assert get(url)[0] == 401
    assert get(url, READER, "wrong")[0] == 401
    assert get(url, "reader", "pw")[0] == 401  # a role without stats_export
    assert get(f"{manager.url}/pools/default", READER, READER_PASSWORD)[0] == 401  # only stats
    status, body = get(url, READER, READER_PASSWORD)
    assert status == 200
    assert get(url, DEFAULT_USER, DEFAULT_PASSWORD)[0] == 200
    text = body.decode()
    promtool_check(text)
    got = samples(text)
    assert sum(v for k, v in got.items() if k.startswith('cm_nodes{membership="active"')) == 3
    assert got["cm_rebalance_running"] == 0
    vbuckets = [v for k, v in got.items() if k.startswith("cm_node_vbuckets{") and "active" in k]
    assert sum(vbuckets) == 16
    status, body = get(f"{manager.url}/prometheus_sd_config", READER, READER_PASSWORD)
    assert status == 200
    groups = json.loads(body)
    assert groups[0]["labels"] == {"dcpkv_role": "manager"}
    assert groups[0]["targets"] == [f"127.0.0.1:{manager.port}"]
    nodes = {g["labels"]["dcpkv_node"]: g["targets"] for g in groups[1:]}
    assert nodes == {cluster.name(n): [f"127.0.0.1:{metrics_port(n)}"] for n in cluster.nodes}
    status, body = get(f"http://{nodes[cluster.name(cluster.nodes[0])][0]}/metrics")
    assert status == 200
    promtool_check(body.decode())
    assert (
        samples(body.decode())['kv_dcp_connections{bucket="default",connection_type="replication"}']
        >= 1
    )


def test_prometheus_scrapes_the_cluster_through_the_manager_during_a_rebalance_and_a_failover(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    prometheus_factory: list[Prometheus],
    tmp_path: Path,
) -> None:
    cluster = monitored_cluster(server_factory, manager_factory, tmp_path)
    manager = cluster.manager
    prometheus = Prometheus(tmp_path, manager.url)
    prometheus_factory.append(prometheus)
    nodes = list(cluster.nodes)
    up = "count(up{dcpkv_role='data'} == 1)"
    wait_for(lambda: _value(prometheus.query(up)) == 3, "3 nodes scraped", timeout_s=60)
    with Load(nodes) as load:
        wait_for(lambda: load.writes > 200, "the load to start")
        newcomer = server_factory(
            tmp_path / "n3", tmp_path / "n3.log", "--managed", "--vbuckets", "16",
            "--metrics-port", "0",
        )  # fmt: skip
        newcomer.start()
        manager.api("POST", "/controller/addNode", hostname=cluster.name(newcomer))
        nodes.append(newcomer)
        done = rebalance(manager)
        assert done["state"] == "idle", done
        wait_for(lambda: _value(prometheus.query(up)) == 4, "the newcomer scraped", timeout_s=60)
        writes = load.writes
        wait_for(lambda: load.writes > writes + 200, "writes after the rebalance")
    victim = nodes[0]
    victim.kill9()
    manager.api("POST", "/controller/failOver", otpNode=cluster.name(victim))
    wait_for(lambda: _value(prometheus.query(up)) == 3, "the victim left the targets", 60)

    def answered() -> bool:
        failovers = _value(prometheus.query("cm_failover_count"))
        rebalances = _value(prometheus.query('cm_rebalance_ended_count{result="done"}'))
        return failovers == 1 and rebalances == 1

    wait_for(answered, "the manager's counts scraped", timeout_s=60)
    rates = prometheus.query('sum(rate(kv_ops{op=~"set|get"}[1m]))')
    assert _value(rates) > 0
    remaining = prometheus.query("kv_dcp_items_remaining")
    kinds = {r["metric"]["connection_type"] for r in remaining}
    assert kinds == {"replication", "spark", "other"}
    assert {r["metric"]["dcpkv_node"] for r in remaining} == {cluster.name(n) for n in nodes[1:]}
    progress = prometheus.query("cm_rebalance_progress")
    assert _value(progress) == 1.0
    dashboard_queries_run(prometheus)


DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "dcpkv.json"


def dashboard_queries_run(prometheus: Prometheus) -> None:
    """Every query of the Grafana dashboard parses and runs, and every kv_ and cm_ metric it
    names is one Prometheus scraped (the pipelines' are not: no Spark job runs here)."""
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    status, body = get(f"http://127.0.0.1:{prometheus.port}/api/v1/label/__name__/values")
    assert status == 200
    scraped = set(json.loads(body)["data"])
    for expr in exprs:
        prometheus.query(expr.replace("$bucket", ".*").replace("$op", ".*"))
        for name in re.findall(r"\b(?:kv|cm)_[a-z_]+", expr):
            assert name in scraped or f"{name.removesuffix('_bucket')}_count" in scraped, name


def _value(result: list[dict[str, Any]]) -> float:
    """The one sample of an instant query's answer (0 when it has none)."""
    if not result:
        return 0.0
    assert len(result) == 1, result
    return float(result[0]["value"][1])

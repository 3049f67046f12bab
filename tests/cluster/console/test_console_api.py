"""The console's routes on a real manager and real nodes (3 nodes, 16 vbuckets, one cluster for
the module), over HTTP without a browser: the login, the page and its files, the JSON it
polls, and the refusal of writes sent from another site's page."""

from __future__ import annotations

import base64
import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from dcpkv.cluster.console import STATIC
from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.managerproc import Cluster, client, start_cluster, tracked_managers, wait_for
from support.serverproc import tracked_servers

LOGIN = base64.b64encode(f"{DEFAULT_USER}:{DEFAULT_PASSWORD}".encode()).decode()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def call(
    cluster: Cluster,
    path: str,
    *,
    method: str = "GET",
    login: bool = True,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        cluster.manager.url + path, data=body, method=method, headers=headers or {}
    )
    if login:
        request.add_header("Authorization", f"Basic {LOGIN}")
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def doc(cluster: Cluster, path: str) -> dict[str, Any]:
    status, _, body = call(cluster, path)
    assert status == 200, body
    return json.loads(body)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module: its tests read, and write one key per vbucket."""
    with tracked_servers() as servers, tracked_managers() as managers:
        tmp = tmp_path_factory.mktemp("console")
        yield start_cluster(servers, managers, tmp, nodes=3, replicas=1)


def test_everything_the_console_serves_needs_the_admins_login(cluster: Cluster) -> None:
    for path in ("/ui/", "/ui/static/console.js", "/ui/api/overview", "/ui/api/dcp"):
        status, headers, _ = call(cluster, path, login=False)
        assert status == 401, path
        assert headers["WWW-Authenticate"] == 'Basic realm="dcpkv"'  # the browser asks for it


def test_the_page_its_files_and_their_headers(cluster: Cluster) -> None:
    status, headers, _ = call(cluster, "/ui")
    assert (status, headers["Location"]) == (302, "/ui/")
    status, headers, page = call(cluster, "/ui/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert page == (STATIC / "index.html").read_bytes()
    policy = headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in policy and "'sha256-" in policy
    assert headers["X-Frame-Options"] == "DENY"
    for name in ("console.js", "console.css", "vendor/preact.mjs", "vendor/uPlot.iife.min.js"):
        status, headers, body = call(cluster, f"/ui/static/{name}")
        assert status == 200 and body == (STATIC / name).read_bytes(), name
        # with nosniff, a browser runs a module only when it is served as JavaScript
        kind = "css" if name.endswith(".css") else "javascript"
        assert kind in headers["Content-Type"], (name, headers["Content-Type"])
    status, _, _ = call(cluster, "/ui/static/no-such-file.js")
    assert status == 404


def test_the_overview_shows_the_nodes_their_share_and_the_writes(cluster: Cluster) -> None:
    overview = doc(cluster, "/ui/api/overview")
    names = sorted(cluster.name(n) for n in cluster.nodes)
    assert sorted(n["hostname"] for n in overview["nodes"]) == names
    assert sum(n["actives"] for n in overview["nodes"]) == 16
    assert sum(n["replicas"] for n in overview["nodes"]) == 16
    (bucket,) = overview["buckets"]
    assert (bucket["name"], bucket["numVBuckets"], bucket["placed"]) == ("default", 16, True)
    assert overview["rebalance"]["state"] == "idle" and overview["failover"]["failedOver"] == []
    wait_for(
        lambda: all(n["status"] == "healthy" for n in doc(cluster, "/ui/api/overview")["nodes"]),
        "every node healthy",
    )
    # writes: one item per vbucket, each on its active; the figures follow
    before = doc(cluster, "/ui/api/overview")["buckets"][0]["mutations"]
    keys = write_one_per_vbucket(cluster)
    wait_for(
        lambda: doc(cluster, "/ui/api/overview")["buckets"][0]["items"] == len(keys),
        "the items counted",
    )
    assert doc(cluster, "/ui/api/overview")["buckets"][0]["mutations"] >= before + len(keys)


def write_one_per_vbucket(cluster: Cluster) -> list[bytes]:
    """One key in each vbucket, written on its active (as the map a node serves names it)."""
    with client(cluster.nodes[0]) as kv:
        served = json.loads(kv.call(Opcode.GetClusterConfig).value)["vBucketServerMap"]
    keys: dict[int, bytes] = {}
    for i in itertools.count():
        keys.setdefault(vbucket_for_key(f"key-{i}".encode(), 16), f"key-{i}".encode())
        if len(keys) == 16:
            break
    for vb, key in keys.items():
        active = served["serverList"][served["vBucketMap"][vb][0]]
        with client(cluster.node(active)) as kv:
            assert kv.set(key, b"{}", vbucket=vb).status == Status.Success
    return list(keys.values())


def test_dcp_shows_each_nodes_replication_connections(cluster: Cluster) -> None:
    def connections() -> dict[str, list[dict[str, Any]]]:
        return {n["node"]: n["connections"] for n in doc(cluster, "/ui/api/dcp")["nodes"]}

    def actives() -> dict[str, int]:
        return {n["hostname"]: n["actives"] for n in doc(cluster, "/ui/api/overview")["nodes"]}

    def settled() -> bool:
        """Every node streams its actives to the replicas on the two others: two connections,
        one replica each, so a stream per active vbucket (streams open a moment after their
        connection)."""
        conns, active = connections(), actives()
        return set(conns) == names and all(
            len(c) == 2 and sum(s["streams"] for s in c) == active[node]
            for node, c in conns.items()
        )

    names = {cluster.name(n) for n in cluster.nodes}
    wait_for(settled, "two replication connections on every node, a stream per active", 30)
    for node, conns in connections().items():
        assert {c["type"] for c in conns} == {"replication"}, node


def test_a_write_from_another_sites_page_is_refused(cluster: Cluster) -> None:
    form = b"otpNode=127.0.0.1:1"  # no such node: a write that would be refused anyway (400)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    foreign = {**headers, "Origin": "http://evil.example"}
    status, _, body = call(
        cluster, "/controller/failOver", method="POST", headers=foreign, body=form
    )
    assert status == 403 and b"another site" in body
    own = {**headers, "Origin": cluster.manager.url}
    status, _, body = call(cluster, "/controller/failOver", method="POST", headers=own, body=form)
    assert status == 400 and b"not an active node" in body  # reached the API
    status, _, _ = call(cluster, "/controller/failOver", method="POST", headers=headers, body=form)
    assert status == 400  # no Origin (a command-line client): reached the API
    status, _, _ = call(cluster, "/ui/api/overview", headers={"Origin": "http://evil.example"})
    assert status == 200  # reading is not refused (and the browser keeps it from that page)
    assert [n["clusterMembership"] for n in cluster.status()["nodes"]] == ["active"] * 3

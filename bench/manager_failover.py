"""Managers on etcd: a node killed after the leading manager is still failed over, and when
(issue 32's "done when"). Not in ``make bench``: each trial starts a cluster of its own.

Theory of operation
-------------------
Each trial runs ``dcpkv cluster up --nodes 3`` (three etcd members, a manager per node, the
default lease TTL of 10 s) as an operator would, in a fresh folder, and acts from outside by
PID only. Once a manager leads and every node is healthy, it turns automatic failover on
(``--failover-timeout``), then kills -9 the leading manager and, 2 s later, a data node
(node0, node1, node2 in turn). ``cluster up`` starts the killed manager again, as it does.
Every 50 ms it asks each manager (``/pools/default/managers``, ``/pools/default``) until one
leads in a newer term and the node is failed over. Per trial, from the node's kill:

* ``lead``      until a manager says it leads in a newer term (negative: before the kill);
* ``failover``  until the cluster says the node is failed over;

and who led next and who failed the node over (the manager whose log names it with
``event=failover``). The bound the issue sets is the failover timeout plus one lease TTL,
counted from the node's kill: the old leader's lease runs out at most a TTL after its last
keep-alive (before its kill, so before the node's), then the next leader's health watcher
needs the timeout to call the node down. Reported: the median and the maximum over the
trials, and how many passed the bound (the poll adds up to ~0.1 s). The exit status is 1 when
a node was not failed over within 120 s.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

import _placement
from _report import bench_main, write_json
from dcpkv.cluster.admin_client import admin_answer
from dcpkv.cluster.leadership import DEFAULT_LEASE_TTL_S

MANAGERS = ("manager0", "manager1", "manager2")
NODES = ("node0", "node1", "node2")
POLL_S = 0.05
LEADER_TO_NODE_S = 2.0  # the gap between the two kills
GIVE_UP_S = 120.0


@dataclass(frozen=True, slots=True)
class Trial:
    old_leader: str
    node: str
    next_leader: str
    failed_over_by: str
    lead_s: float  # the node's kill to a manager leading in a newer term
    failover_s: float  # the node's kill to the node failed over


class Up:
    """One ``dcpkv cluster up --nodes 3`` in ``data``, stopped by PID (SIGTERM)."""

    def __init__(self, data: Path, vbuckets: int) -> None:
        self.data = data
        argv = [
            sys.executable, "-m", "dcpkv.cli.main", "cluster", "up", "--nodes", "3",
            "--replicas", "1", "--vbuckets", str(vbuckets), "--data-dir", str(data), "--etcd",
        ]  # fmt: skip
        data.mkdir(parents=True)
        with open(data.parent / f"{data.name}-up.err", "w") as err, _placement.servers():
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=90)

    def pid(self, name: str) -> int:
        return int((self.data / f"{name}.pid").read_text())

    def address(self, node: str) -> str:
        return f"127.0.0.1:{int((self.data / f'{node}.port').read_text())}"

    def api(self, manager: str, path: str, method: str = "GET", **params: str) -> Any:
        """``manager``'s answer; None while it does not answer (down, restarting)."""
        try:
            port = int((self.data / f"{manager}.port").read_text())
        except (OSError, ValueError):  # (not written yet, or being written)
            return None
        return admin_answer(f"http://127.0.0.1:{port}", method, path, params=params or None)

    def leader(self) -> tuple[str, int] | None:
        """The manager that says it leads, and its term (the newest)."""
        best = None
        for name in MANAGERS:
            view = self.api(name, "/pools/default/managers")
            if view and view["role"] == "leader" and (best is None or view["term"] > best[1]):
                best = (name, int(view["term"]))
        return best

    def membership(self, manager: str, node: str) -> str | None:
        doc = self.api(manager, "/pools/default")
        if doc is None:
            return None
        found = [n["clusterMembership"] for n in doc["nodes"] if n["hostname"] == node]
        return found[0] if found else None

    def ready(self) -> bool:
        """A manager leads, all three are listed, every node healthy and the map placed."""
        found = self.leader()
        if found is None:
            return False
        view = self.api(found[0], "/pools/default/managers")
        doc = self.api(found[0], "/pools/default")
        return (
            view is not None and len(view["managers"]) == len(MANAGERS)
            and doc is not None and bool(doc["buckets"]) and doc["buckets"][0]["placed"]
            and all(n["status"] == "healthy" for n in doc["nodes"])
        )  # fmt: skip

    def failed_over_by(self, node: str, timeout_s: float = 5.0) -> str:
        """The manager whose log says it failed ``node`` over (it logs once the store holds
        the failover, which the API may show first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name in MANAGERS:
                text = (self.data / f"{name}.log").read_text(errors="replace")
                if any("event=failover" in line and node in line for line in text.splitlines()):
                    return name
            time.sleep(0.1)
        return "none logged it"


def wait(condition: Any, what: str, up: Up, timeout_s: float = GIVE_UP_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if up.proc.poll() is not None:
            raise SystemExit(f"cluster up exited ({up.proc.returncode}) waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what} (see {up.data})")
        time.sleep(0.2)


def trial(up: Up, node: str, failover_timeout: int) -> Trial | None:
    """Kill the leader, 2 s later ``node``; None when the node was not failed over."""
    wait(up.ready, "a leader and every node healthy", up)
    found = up.leader()
    assert found is not None
    leader, term = found
    answer = up.api(leader, "/settings/autoFailover", "POST", enabled="true",
                    timeout=str(failover_timeout))  # fmt: skip
    if answer is None:
        raise SystemExit(f"{leader} refused the auto-failover settings")
    name = up.address(node)
    leader_killed = time.monotonic()
    os.kill(up.pid(leader), signal.SIGKILL)
    time.sleep(LEADER_TO_NODE_S)
    os.kill(up.pid(node), signal.SIGKILL)
    killed = time.monotonic()
    led: tuple[str, float] | None = None
    while time.monotonic() - killed < GIVE_UP_S:
        now = time.monotonic()
        found = up.leader()
        if led is None and found is not None and found[1] > term:
            led = (found[0], now)
        if led is not None and up.membership(led[0], name) == "failed":
            print(f"  {leader} killed, {node} 2 s later: {led[0]} leads "
                  f"{led[1] - leader_killed:.1f} s after the leader's kill, {node} failed over "
                  f"{now - killed:.1f} s after its own", flush=True)  # fmt: skip
            by = up.failed_over_by(name)
            return Trial(leader, node, led[0], by, led[1] - killed, now - killed)
        time.sleep(POLL_S)
    print(f"  {node} NOT failed over in {GIVE_UP_S:.0f} s (new leader: {led})", flush=True)
    return None


def main(
    trials: Annotated[int, typer.Option(help="Clusters started, one kill pair each.")] = 5,
    failover_timeout: Annotated[int, typer.Option(help="Auto-failover timeout (s).")] = 5,
    vbuckets: Annotated[int, typer.Option(help="vbuckets of the bucket.")] = 64,
    keep: Annotated[bool, typer.Option(help="Keep the clusters' folders (logs).")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write figures here.")] = None,
) -> None:
    """kill -9 of the leading manager, then of a node: time to a new leader and failover."""
    ttl = DEFAULT_LEASE_TTL_S
    bound = failover_timeout + ttl
    print(f"manager_failover: {trials} trials, failover timeout {failover_timeout} s, lease TTL "
          f"{ttl} s: bound {bound} s from the node's kill", flush=True)  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="dcpkv-bench-manager-failover-"))
    done: list[Trial] = []
    for i in range(trials):
        up = Up(root / f"trial{i}", vbuckets)
        try:
            found = trial(up, NODES[i % len(NODES)], failover_timeout)
        finally:
            up.stop()
        if found is None:
            print(f"  (logs kept in {up.data})")
            keep = True
            continue
        done.append(found)
        print(f"  trial {i}: next leader {found.next_leader}, {found.node} failed over by "
              f"{found.failed_over_by}", flush=True)  # fmt: skip
    if not keep:
        subprocess.run(["rm", "-rf", str(root)], check=False)
    if not done:
        raise SystemExit("no trial failed its node over")
    failovers = [t.failover_s for t in done]
    leads = [t.lead_s for t in done]
    figures = {
        "failover_s_median": statistics.median(failovers),
        "failover_s_max": max(failovers),
        "new_leader_s_median": statistics.median(leads),
        "new_leader_s_max": max(leads),
        "bound_s": float(bound),
        "trials_past_bound": float(sum(s > bound for s in failovers)),
        "trials_without_failover": float(trials - len(done)),
    }
    write_json(
        json_out, "manager_failover", figures, trials=trials, lease_ttl_s=ttl,
        failover_timeout_s=failover_timeout,
        runs=[asdict(t) for t in done],
    )  # fmt: skip
    if len(done) < trials:
        raise SystemExit(1)


if __name__ == "__main__":
    bench_main(main)

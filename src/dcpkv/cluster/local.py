"""``dcpkv cluster up``: a whole cluster on this machine for development and tests.

Theory of operation
-------------------
Like Couchbase's ``cluster_run``: N ``dcpkv server --managed`` processes and one
``dcpkv manager`` over them, each a child process of this one, every file under one folder::

    D/node0/  D/node0.log  D/node0.port  D/node0.pid  (the data node's folder, log, port, PID)
    ...
    D/manager/cluster.json  D/manager.log  D/manager.port  D/manager.pid

With ``etcd_members`` (``up`` with 3 nodes or more) there is a manager per node
(``D/manager0/``, ``D/manager0.log``...), all over an etcd cluster of that many members on
loopback (``D/etcd0/`` its data, ``D/etcd0.log``, ``D/etcd0.ports`` its client and peer
ports); the managers elect one leader (:mod:`~dcpkv.cluster.leader_service`), any of them
answers the API.

Each node serves Prometheus metrics on a free loopback port (``--metrics-port 0``); the
manager's ``/prometheus_sd_config`` lists them.

Ports are free ones picked by the kernel (``--port 0`` and a port file); a second ``up`` on
the same folder reuses the ports the files name, so the saved configuration still addresses
its nodes. The nodes start first; the manager gets them as seeds (it ignores them when its
folder already holds a configuration). ``up`` then prints where everything is and waits.
SIGINT or SIGTERM stops the manager, then the nodes, each by its PID: SIGTERM, and SIGKILL
after a grace period. The children are siblings: each runs in its own process group (a
terminal's Ctrl-C reaches only the parent, which stops them in that order), none is tied to
another, so a crashed manager takes no node with it. ``up`` watches them: a child that exits
by itself is reported on stderr once; a manager is started again on its port (the nodes keep
serving meanwhile, and the restarted manager reads the configuration from its folder). Only
the parent's own death stops them: they get SIGTERM if ``up`` dies
(:func:`~dcpkv.core.children.die_with_parent`).

A job that injects faults (``dcpkv demo --chaos``) kills one child with :meth:`Child.kill9`
and brings it back on the same port with :meth:`Child.restart`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from dcpkv.cluster.etcd_members import Member, endpoints, free_port, member_argv
from dcpkv.core.children import die_with_parent
from dcpkv.core.errors import DcpkvError

START_TIMEOUT_S = 60.0
STOP_GRACE_S = 15.0


class LocalClusterError(DcpkvError, RuntimeError):
    """A process of the local cluster did not start."""


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    port_file: Path
    proc: subprocess.Popen[bytes] | None = None
    terminated: subprocess.Popen[bytes] | None = None  # the process SIGTERM was sent to
    port: int = 0
    restartable: bool = False  # managers: started again when they exit by themselves
    reported: bool = False  # its exit was reported (cleared by a new start)
    health_url: str | None = None  # ready when this answers (etcd), else when the port file is

    def start(self) -> None:
        self.port_file.unlink(missing_ok=True)
        self.reported = False
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, process_group=0,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        self.log_path.with_suffix(".pid").write_text(f"{self.proc.pid}\n")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL (a crash: no final flush), by PID; waits for the exit."""
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def restart(self, deadline: float) -> int:
        """Start again on the port it had (the cluster configuration names it); the port."""
        if self.port and "--port" in self.argv:
            self.argv[self.argv.index("--port") + 1] = str(self.port)
        self.start()
        return self.wait_port(deadline)

    def wait_port(self, deadline: float) -> int:
        assert self.proc is not None
        while not self._ready():
            if self.proc.poll() is not None:
                raise LocalClusterError(
                    f"{self.name} exited with {self.proc.returncode}; see {self.log_path}"
                )
            if time.monotonic() > deadline:
                raise LocalClusterError(f"{self.name} did not start; see {self.log_path}")
            time.sleep(0.05)
        if self.health_url is None:
            self.port = int(self.port_file.read_text())
        return self.port

    def _ready(self) -> bool:
        if self.health_url is None:
            return self.port_file.exists()
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as answer:
                return bool(json.load(answer).get("health") == "true")
        except (OSError, ValueError):
            return False

    def terminate(self) -> None:
        """SIGTERM by PID, without waiting."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.terminated = self.proc

    def stop(self) -> None:
        """SIGTERM (once: a second one, arriving while the child shuts down after the first,
        would kill it mid-way), then SIGKILL after the grace period; by PID, this child only."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.terminated is not self.proc:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class LocalCluster:
    data_dir: Path
    nodes: int
    replicas: int
    num_vbuckets: int = 1024
    manager_port: int = 0
    host: str = "127.0.0.1"
    etcd_members: int = 0  # 0: one manager, cluster.json; else this many etcd members and
    children: list[Child] = field(default_factory=list)  # a manager per node
    etcd_endpoints: str = ""
    # More `dcpkv server` flags for every data node (bucket settings such as
    # --durability-min-level: a node's bucket settings are its own).
    node_flags: tuple[str, ...] = ()
    # More `dcpkv manager` flags for every manager (--lease-ttl)
    manager_flags: tuple[str, ...] = ()

    def _previous_port(self, name: str) -> int:
        try:
            return int((self.data_dir / f"{name}.port").read_text())
        except (OSError, ValueError):
            return 0

    def _cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "dcpkv.cli.main", *args]

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        members = self._start_etcd() if self.etcd_members else []
        node_children = []
        for i in range(self.nodes):
            name = f"node{i}"
            argv = self._cli(
                "server",
                "--managed",
                "--host",
                self.host,
                "--port",
                str(self._previous_port(name)),
                "--port-file",
                str(self.data_dir / f"{name}.port"),
                "--data-dir",
                str(self.data_dir / name),
                "--vbuckets",
                str(self.num_vbuckets),
                *self.node_flags,
                "--metrics-port",  # a free loopback port: the manager's /prometheus_sd_config
                "0",
            )
            node_children.append(self._child(name, argv))
        for child in members + node_children:
            child.wait_port(deadline)
        seeds = [arg for c in node_children for arg in ("--node", f"{self.host}:{c.port}")]
        names = [f"manager{i}" for i in range(self.nodes)] if members else ["manager"]
        managers = [self._start_manager(name, seeds) for name in names]
        for manager in managers:
            manager.wait_port(deadline)

    def _start_manager(self, name: str, seeds: list[str]) -> Child:
        first = name in ("manager", "manager0")
        port = (self.manager_port if first else 0) or self._previous_port(name)
        argv = self._cli(
            "manager",
            "--host",
            self.host,
            "--port",
            str(port),
            "--port-file",
            str(self.data_dir / f"{name}.port"),
            "--data-dir",
            str(self.data_dir / name),
            "--replicas",
            str(self.replicas),
            "--vbuckets",
            str(self.num_vbuckets),
            *seeds,
            *self.manager_flags,
        )
        if self.etcd_endpoints:
            argv += ["--etcd", self.etcd_endpoints, "--name", name]
        return self._child(name, argv, restartable=True)

    def _start_etcd(self) -> list[Child]:
        """The etcd members, on the ports a previous run used (its data names them)."""
        members = []
        for i in range(self.etcd_members):
            name = f"etcd{i}"
            ports = self.data_dir / f"{name}.ports"
            try:
                client, peer = (int(p) for p in ports.read_text().split())
            except (OSError, ValueError):
                client, peer = free_port(self.host), free_port(self.host)
                ports.write_text(f"{client} {peer}\n")
            members.append(Member(name, client, peer, self.data_dir / name))
        self.etcd_endpoints = endpoints(members, self.host)
        children = []
        for member in members:
            child = self._child(member.name, member_argv(member, members, self.host))
            child.port = member.client_port
            child.health_url = f"http://{self.host}:{member.client_port}/health"
            children.append(child)
        return children

    def _child(self, name: str, argv: list[str], restartable: bool = False) -> Child:
        log, port_file = self.data_dir / f"{name}.log", self.data_dir / f"{name}.port"
        child = Child(name, argv, log, port_file, restartable=restartable)
        self.children.append(child)
        child.start()
        return child

    @property
    def manager(self) -> Child:
        """The manager (the first of several: any one answers the whole API)."""
        return self.managers[0]

    @property
    def managers(self) -> list[Child]:
        return [c for c in self.children if c.name.startswith("manager")]

    @property
    def data_nodes(self) -> list[Child]:
        return [c for c in self.children if c.name.startswith("node")]

    @property
    def etcd(self) -> list[Child]:
        return [c for c in self.children if c.name.startswith("etcd")]

    @property
    def manager_url(self) -> str:
        return f"http://{self.host}:{self.manager.port}"

    def address(self, child: Child) -> str:
        """How the cluster names a data node: host:port."""
        return f"{self.host}:{child.port}"

    def describe(self, out: IO[str]) -> None:
        for child in self.managers:
            out.write(f"{child.name:<8} http://{self.host}:{child.port}/  (log {child.log_path})\n")
        for child in self.data_nodes + self.etcd:
            out.write(f"{child.name:<8} {self.host}:{child.port}  (log {child.log_path})\n")
        out.write(f"pid {os.getpid()}: Ctrl-C or SIGTERM stops every process\n")
        out.flush()

    def wait(self, err: IO[str] | None = None) -> int:
        """Until SIGINT or SIGTERM (then 0), watching the children meanwhile (:meth:`watch`)."""
        stopping = False

        def on_signal(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not stopping:
                self.watch(err or sys.stderr)
                time.sleep(0.2)
            return 0
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def watch(self, err: IO[str]) -> None:
        """One look at the children: report each that exited by itself, restart managers."""
        for child in self.children:
            if child.proc is None or child.proc.poll() is None or child.reported:
                continue
            child.reported = True
            code = child.proc.returncode
            if not child.restartable:
                err.write(f"dcpkv cluster up: {child.name} exited ({code}); see {child.log_path}\n")
                err.flush()
                continue
            err.write(f"dcpkv cluster up: {child.name} exited ({code}); starting it again\n")
            err.flush()
            try:
                child.restart(time.monotonic() + START_TIMEOUT_S)
            except LocalClusterError as exc:  # reported; the next look tries again
                err.write(f"dcpkv cluster up: {exc}\n")
                err.flush()

    def stop(self) -> None:
        """The managers first (they must not see the nodes go and react), then the nodes,
        then etcd (which the managers needed to step down). A group is signalled at once, so
        no manager takes over the lead from another that is stopping."""
        for group in (self.managers, self.data_nodes, self.etcd):
            for child in group:
                child.terminate()
            for child in group:
                child.stop()

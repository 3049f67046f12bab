"""The chaos suite's managers on etcd (``chaos.py --etcd``): the processes and who leads.

What runs
    Three etcd members (``support/etcdproc.py``) and a ``dcpkv manager --etcd`` per data
    node (``manager0``...), each seeded with the nodes' proxy addresses and a short lease
    (:data:`LEASE_TTL_S`), as ``dcpkv cluster up --nodes 3`` runs them. One manager leads;
    any answers the API (a follower forwards writes to the leader).

    Each manager reaches each etcd member through a proxy of its own (``linkproxy.py``), so
    one manager can be cut off from etcd while it still reaches the nodes and the others
    reach etcd: a network partition around one manager, the leader's lease running out
    while its process runs on (``chaos.py``'s ``etcd-cut``).

Who leads
    Each manager answers ``GET /pools/default/managers`` with its own view (its role and
    term), whether or not etcd answers. :func:`leader_of` asks every running manager that is
    not stopped (a SIGSTOPped one would hold the caller until the request's timeout) and takes
    the one that says it leads, the newest term first. :func:`terms_led` reads the managers'
    logs: which manager won which term (two managers in one term would be a broken election).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from dcpkv.cluster.admin_client import AdminError
from support.etcdproc import EtcdCluster
from support.linkproxy import LinkProxy, Proxies
from support.managerproc import VBUCKETS, ManagerProcess

LEASE_TTL_S = 3  # etcd's floor is 2; short, so a leader's death costs a few seconds
LEADS = re.compile(r"manager (\S+) leads, term (\d+)")
STOPS = re.compile(r"manager (\S+) stops leading \(term (\d+)\)")
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")  # (dcpkv.core.logs, text)
STAMP_FORMAT = "%Y-%m-%d %H:%M:%S,%f"


def start_managers(
    managers: type[ManagerProcess], workdir: Path, seeds: list[str], replicas: int,
    etcd: EtcdCluster, proxies: Proxies, lease_ttl_s: int = LEASE_TTL_S,
) -> tuple[list[ManagerProcess], dict[str, list[LinkProxy]]]:  # fmt: skip
    """A manager per seed over ``etcd``, each started (listening: it may not lead yet), and
    each one's links to the etcd members (by name)."""
    started, links = [], {}
    for i in range(len(seeds)):
        name = f"manager{i}"
        links[name] = [proxies.link(member.client_port) for member in etcd.members]
        endpoints = ",".join(f"127.0.0.1:{link.port}" for link in links[name])
        manager = managers(
            workdir / name, workdir / f"{name}.log", "--replicas", str(replicas),
            "--vbuckets", str(VBUCKETS), *(arg for seed in seeds for arg in ("--node", seed)),
            "--etcd", endpoints, "--name", name, "--lease-ttl", str(lease_ttl_s),
        )  # fmt: skip
        manager.start()
        started.append(manager)
    return started, links


def name_of(manager: ManagerProcess) -> str:
    """The name given with ``--name``."""
    return manager.data_dir.name


def running(managers: Iterable[ManagerProcess], stopped: set[str]) -> list[ManagerProcess]:
    return [
        m
        for m in managers
        if m.proc is not None and m.proc.poll() is None and name_of(m) not in stopped
    ]


def leader_of(
    managers: Iterable[ManagerProcess], stopped: set[str]
) -> tuple[ManagerProcess, int] | None:
    """The manager that says it leads, and its term (the newest, should two say so); None
    while none does (an election under way, etcd without a quorum)."""
    best: tuple[ManagerProcess, int] | None = None
    for manager in running(managers, stopped):
        try:
            view = manager.api("GET", "/pools/default/managers")
        except AdminError:
            continue
        if view.get("role") == "leader" and (best is None or view["term"] > best[1]):
            best = (manager, int(view["term"]))
    return best


def terms_led(managers: Iterable[ManagerProcess]) -> dict[int, set[str]]:
    """term -> the managers whose logs say they won it."""
    terms: dict[int, set[str]] = {}
    for manager in managers:
        try:
            text = manager.log()
        except OSError:
            continue
        for name, term in LEADS.findall(text):
            terms.setdefault(int(term), set()).add(name)
    return terms


def won_at(managers: Iterable[ManagerProcess]) -> dict[int, tuple[str, datetime]]:
    """term -> the manager that won it and when (its log line's time)."""
    found: dict[int, tuple[str, datetime]] = {}
    for manager in managers:
        for when, name, term in _lines(manager, LEADS):
            found.setdefault(int(term), (name, when))
    return found


def stopped_at(manager: ManagerProcess, term: int) -> datetime | None:
    """When ``manager`` stopped acting for ``term`` (its log's "stops leading" line)."""
    for when, _name, stopped in _lines(manager, STOPS):
        if int(stopped) == term:
            return when
    return None


def _lines(
    manager: ManagerProcess, pattern: re.Pattern[str]
) -> Iterator[tuple[datetime, str, str]]:
    """Each log line of ``manager`` that ``pattern`` matches: its time, its two groups."""
    try:
        text = manager.log()
    except OSError:
        return
    for line in text.splitlines():
        found = pattern.search(line)
        stamp = STAMP.match(line)
        if found and stamp:
            yield datetime.strptime(stamp.group(0), STAMP_FORMAT), found[1], found[2]

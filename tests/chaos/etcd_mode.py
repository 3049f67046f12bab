"""The chaos suite's managers on etcd (``chaos.py --etcd``): the processes and who leads.

What runs
    Three etcd members (``support/etcdproc.py``) and a ``dcpkv manager --etcd`` per data
    node (``manager0``...), each seeded with the nodes' proxy addresses and a short lease
    (:data:`LEASE_TTL_S`), as ``dcpkv cluster up --nodes 3`` runs them. One manager leads;
    any answers the API (a follower forwards writes to the leader).

Who leads
    Each manager answers ``GET /pools/default/managers`` with its own view (its role and
    term), whether or not etcd answers. :func:`leader_of` asks every running manager that is
    not stopped (a SIGSTOPped one would hold the caller until the request's timeout) and takes
    the one that says it leads, the newest term first. :func:`terms_led` reads the managers'
    logs: which manager won which term (two managers in one term would be a broken election).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from dcpkv.cluster.admin_client import AdminError
from support.etcdproc import EtcdCluster
from support.managerproc import VBUCKETS, ManagerProcess

LEASE_TTL_S = 3  # etcd's floor is 2; short, so a leader's death costs a few seconds
LEADS = re.compile(r"manager (\S+) leads, term (\d+)")


def start_managers(
    managers: type[ManagerProcess], workdir: Path, seeds: list[str], replicas: int,
    etcd: EtcdCluster, lease_ttl_s: int = LEASE_TTL_S,
) -> list[ManagerProcess]:  # fmt: skip
    """A manager per seed over ``etcd``, each started (listening: it may not lead yet)."""
    started = []
    for i in range(len(seeds)):
        name = f"manager{i}"
        manager = managers(
            workdir / name, workdir / f"{name}.log", "--replicas", str(replicas),
            "--vbuckets", str(VBUCKETS), *(arg for seed in seeds for arg in ("--node", seed)),
            "--etcd", etcd.endpoints, "--name", name, "--lease-ttl", str(lease_ttl_s),
        )  # fmt: skip
        manager.start()
        started.append(manager)
    return started


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

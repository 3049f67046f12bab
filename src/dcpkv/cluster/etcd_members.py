"""An etcd cluster on this machine: the command line of each member.

Theory of operation
-------------------
``dcpkv cluster up --nodes 3`` and the tests run Debian's ``etcd`` (3.4), one member per data
node, on loopback. A member must know every member's peer URL before it starts
(``--initial-cluster``), so ports are picked first: free ones from the kernel, or the ones a
previous run wrote down (a member that finds its data folder already initialised ignores the
``--initial-*`` flags and rejoins with what it stored). Elections are tuned for one machine
under load: a 100 ms heartbeat and a 1 s election timeout (etcd's defaults).
"""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from dcpkv.core.errors import DcpkvError

ETCD = "etcd"


class EtcdMissing(DcpkvError, RuntimeError):
    """No ``etcd`` executable on the PATH."""


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path


def etcd_binary() -> str:
    found = shutil.which(ETCD)
    if found is None:
        raise EtcdMissing(
            "etcd is not installed: install Debian's etcd-server (apt-get install etcd-server)"
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (the kernel's pick; another process could take it before etcd
    binds it, which etcd reports at start)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def endpoints(members: list[Member], host: str = "127.0.0.1") -> str:
    """The client endpoints, as ``dcpkv manager --etcd`` takes them."""
    return ",".join(f"{host}:{m.client_port}" for m in members)


def member_argv(member: Member, members: list[Member], host: str = "127.0.0.1") -> list[str]:
    cluster = ",".join(f"{m.name}=http://{host}:{m.peer_port}" for m in members)
    client = f"http://{host}:{member.client_port}"
    peer = f"http://{host}:{member.peer_port}"
    return [
        etcd_binary(),
        "--name", member.name,
        "--data-dir", str(member.data_dir),
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", cluster,
        "--initial-cluster-state", "new",
        "--initial-cluster-token", "dcpkv",
    ]  # fmt: skip

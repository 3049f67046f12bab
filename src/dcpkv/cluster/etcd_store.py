"""The cluster configuration in etcd (a :class:`~dcpkv.cluster.store.ClusterStore`).

Theory of operation
-------------------
The configuration is one JSON document (:func:`~dcpkv.cluster.config.to_json`, the format of
``cluster.json``) under ``PREFIX/config``, the users and roles another (``users.json``'s)
under ``PREFIX/users``. :meth:`EtcdStore.load` reads it and remembers its
mod revision; :meth:`EtcdStore.save` writes in one transaction whose conditions are

1. the key's mod revision is still the one read or last written (no lost update), and
2. when the store is *fenced* (a leader's): the leader key's create revision is still the
   term this manager won (:mod:`~dcpkv.cluster.leadership`): a manager whose lease expired,
   even one that does not know it yet, can write nothing.

A failed condition raises :class:`~dcpkv.cluster.store.StoreConflict`, nothing written.
Writes are serialized by one lock, in the order they were called.

The client is ``aetcd`` (asyncio, gRPC). Several endpoints make one gRPC target
(``ipv4:host:port,host:port``): gRPC keeps a connection to one member and moves to another
when it goes. A member that cannot be reached makes a call fail after :data:`CALL_TIMEOUT_S`:
:class:`EtcdUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aetcd  # type: ignore[import-untyped]
import aetcd.exceptions  # type: ignore[import-untyped]

from dcpkv.cluster import config as cfg
from dcpkv.cluster.store import StoreConflict
from dcpkv.core.deadline import within
from dcpkv.core.errors import DcpkvError
from dcpkv.core.rbac import UsersDoc

PREFIX = b"/dcpkv"
CONFIG_KEY = PREFIX + b"/config"
USERS_KEY = PREFIX + b"/users"  # the users document (verifiers only), as users.json
LEADER_KEY = PREFIX + b"/leader"
MANAGERS_PREFIX = PREFIX + b"/managers/"
CALL_TIMEOUT_S = 3


class EtcdUnavailable(DcpkvError):
    """etcd did not answer (no member reachable, or no quorum)."""


def parse_endpoints(endpoints: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` (an ``http://`` in front is allowed) as (host, port) pairs."""
    out = []
    for item in endpoints.split(","):
        item = item.strip().removeprefix("http://")
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"{item!r} is not an etcd endpoint (host:port)")
        out.append((host, int(port)))
    if not out:
        raise ValueError("no etcd endpoint given")
    return out


def connect(endpoints: list[tuple[str, int]]) -> Any:
    """An aetcd client over every endpoint (one gRPC target), not yet connected."""
    *first, (last_host, last_port) = endpoints
    if first:
        head = ",".join(f"{h}:{p}" for h, p in first)
        return aetcd.Client(host=f"ipv4:{head},{last_host}", port=last_port, timeout=CALL_TIMEOUT_S)
    return aetcd.Client(host=last_host, port=last_port, timeout=CALL_TIMEOUT_S)


async def call(work: Any) -> Any:
    """Await one etcd call: its answer, or :class:`EtcdUnavailable`."""
    try:
        return await within(work, CALL_TIMEOUT_S + 1)
    except (aetcd.exceptions.ClientError, TimeoutError, OSError) as exc:
        raise EtcdUnavailable(f"etcd did not answer: {type(exc).__name__} {exc}") from None


class EtcdStore:
    """See the module docstring; ``term`` set: fenced by that leadership."""

    def __init__(self, client: Any, term: int = 0) -> None:
        self.client = client
        self.term = term
        self.revision = 0  # the config key's mod revision read or written (0: absent)
        self.users_revision = 0  # the same for the users key
        self._lock = asyncio.Lock()

    async def load(self) -> cfg.ClusterConfig | None:
        got = await call(self.client.get(CONFIG_KEY))
        if got is None:
            self.revision = 0
            return None
        self.revision = got.mod_revision
        try:
            return cfg.from_json(json.loads(got.value))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            message = f"etcd's {CONFIG_KEY.decode()} is corrupt ({e}); refusing to guess"
            raise cfg.ClusterConfigError(message) from None

    async def save(self, config: cfg.ClusterConfig) -> None:
        raw = json.dumps(cfg.to_json(config)).encode()
        async with self._lock:
            self.revision = await self._put(CONFIG_KEY, raw, self.revision, "configuration")

    async def load_users(self) -> UsersDoc:
        got = await call(self.client.get(USERS_KEY))
        self.users_revision = 0 if got is None else got.mod_revision
        return UsersDoc() if got is None else UsersDoc.decode(got.value, "etcd's users")

    async def save_users(self, doc: UsersDoc) -> None:
        async with self._lock:
            self.users_revision = await self._put(
                USERS_KEY, doc.encode(), self.users_revision, "users"
            )

    async def _put(self, key: bytes, raw: bytes, revision: int, what: str) -> int:
        """Put ``key`` if its mod revision is still ``revision`` (and, fenced, the leader
        key still ours); the new revision, else :class:`StoreConflict`."""
        tx = self.client.transactions
        compare = [tx.mod(key) == revision]
        if self.term:
            compare.append(tx.create(LEADER_KEY) == self.term)
        ok, answers = await call(
            self.client.transaction(compare=compare, success=[tx.put(key, raw)], failure=[])
        )
        if not ok:
            raise StoreConflict(
                f"the {what} in etcd changed since it was read, or this manager no longer "
                f"leads (term {self.term}): nothing written"
            )
        new: int = answers[0].response_put.header.revision
        return new

    async def close(self) -> None:
        """The client belongs to whoever made it (several stores may share one)."""

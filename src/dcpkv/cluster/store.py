"""Where the cluster configuration lives: the seam between the manager and its storage.

Theory of operation
-------------------
The manager reads the configuration once when it starts acting and writes it before it
tells any node (:mod:`~dcpkv.cluster.config`). A :class:`ClusterStore` is that storage:

=====================  =======================================================================
store                  what a write is
=====================  =======================================================================
:class:`FileStore`     ``cluster.json`` (and ``users.json``) in the manager's folder: one
                       manager, one writer (``dcpkv manager`` without ``--etcd``)
``EtcdStore``          one etcd key, written in a transaction conditioned on the revision
                       this manager read or last wrote *and* on its leadership key still
                       being the one it created (:mod:`~dcpkv.cluster.etcd_store`)
=====================  =======================================================================

Every write is conditioned on the revision read: a write that finds another in between
raises :class:`StoreConflict` and changes nothing, so two managers never lose each other's
update; a manager that gets one has lost the lead (or never had it) and must stop acting.
Writes are taken in the order they are called (:meth:`ClusterStore.save` may be awaited
concurrently: a rebalance's handover writes while it pushes).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from dcpkv.cluster import config as cfg
from dcpkv.core.errors import DcpkvError
from dcpkv.core.rbac import USERS_FILE, UsersDoc, load_users, save_users


class StoreConflict(DcpkvError):
    """The store holds a newer configuration than the one this write was based on, or this
    manager's leadership is gone: nothing was written."""


class ClusterStore(Protocol):
    async def load(self) -> cfg.ClusterConfig | None:
        """The configuration, None when there is none yet; remembers its revision."""
        ...

    async def save(self, config: cfg.ClusterConfig) -> None:
        """Write ``config`` if the store still holds what was read or last written; else
        :class:`StoreConflict`."""
        ...

    async def load_users(self) -> UsersDoc:
        """The users and roles (an empty document when none); RbacError when unreadable."""
        ...

    async def save_users(self, doc: UsersDoc) -> None:
        """Write the users document, conditioned as :meth:`save` is."""
        ...

    async def close(self) -> None: ...


class FileStore:
    """``cluster.json`` in ``data_dir``; writes go in order through one thread of their own."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="dcpkv-config")

    async def load(self) -> cfg.ClusterConfig | None:
        return cfg.load(self.data_dir)

    async def save(self, config: cfg.ClusterConfig) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, cfg.save, self.data_dir, config)

    async def load_users(self) -> UsersDoc:
        return load_users(self.data_dir / USERS_FILE)

    async def save_users(self, doc: UsersDoc) -> None:
        save_users(self.data_dir / USERS_FILE, doc)

    async def close(self) -> None:
        self._writer.shutdown(wait=True)

"""The manager's XDCR service: remote clusters, replications, their checkpoints and REST routes.

Theory of operation
-------------------
The service lives in the manager process (``dcpkv manager``) beside the
:class:`~dcpkv.cluster.manager.Manager`, and keeps its records in the manager's folder, the
source cluster's configuration store: ``xdcr.json`` (remote clusters and replications) and
``xdcr-checkpoints/<id>.json`` (each replication's :class:`~.checkpoints.CheckpointLog`),
each written atomically. A change is written before it is acted on.

Every replication not paused has one supervisor task: it runs a
:class:`~.replicator.Replicator` and, when that fails, records the error and runs a new one
after the replication's restart interval (from the checkpoints). Pausing or deleting cancels
the task; the replicator's last checkpoint is written as it stops. The source is this
cluster, read as the cluster admin from the nodes the manager knows.

REST, in the reference's shape (parameters as a form or JSON, basic auth as for every route):

=======  =========================================  ==========================================
POST     ``/pools/default/remoteClusters``           ``name``, ``hostname``, ``username``,
                                                     ``password`` [, ``certificate``: a CA
                                                     file, the remote speaks TLS]
GET      ``/pools/default/remoteClusters``           the remotes (no passwords)
DELETE   ``/pools/default/remoteClusters/NAME``      refused while a replication uses it
POST     ``/controller/createReplication``           ``fromBucket``, ``toCluster``,
                                                     ``toBucket``, ``replicationType=
                                                     continuous``, settings: answers ``id``
POST     ``/settings/replications/ID``               settings, ``pauseRequested=true|false``
DELETE   ``/controller/cancelXDCR/ID``               stop and forget it (and its checkpoints)
GET      ``/pools/default/tasks``                    one ``xdcr`` task per replication: status,
                                                     the reference's stats (changes_left, ...)
=======  =========================================  ==========================================
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from dcpkv.client.settings import ConnectionSettings
from dcpkv.cluster.xdcr.checkpoints import CheckpointLog
from dcpkv.cluster.xdcr.replicator import Replicator
from dcpkv.cluster.xdcr.spec import RemoteCluster, Replication, ReplicationConfig
from dcpkv.core.deadline import within
from dcpkv.core.errors import DcpkvError
from dcpkv.core.files import atomic_write

log = logging.getLogger("dcpkv.xdcr")

STORE = "xdcr.json"
CHECKPOINTS = "xdcr-checkpoints"
SourceOf = Callable[[str], ConnectionSettings]  # bucket -> how to read this cluster


class XdcrRefused(DcpkvError, ValueError):
    """A request the service refused; nothing changed."""


class _Running:
    """A replication's supervisor task and what it reports."""

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.replicator: Replicator | None = None
        self.restarts = 0
        self.last_error = ""
        self.started = time.monotonic()


class XdcrService:
    def __init__(self, data_dir: Path, source_of: SourceOf) -> None:
        self.data_dir = data_dir
        self._source_of = source_of
        self.remotes: dict[str, RemoteCluster] = {}
        self.replications: dict[str, Replication] = {}
        self._running: dict[str, _Running] = {}
        self._load()

    # -- life -------------------------------------------------------------------------------

    def start(self) -> None:
        for rep in self.replications.values():
            if not rep.settings.paused:
                self._run(rep)

    async def stop(self) -> None:
        for rid in list(self._running):
            await self._halt(rid)

    # -- remotes ----------------------------------------------------------------------------

    def add_remote(self, remote: RemoteCluster) -> dict[str, Any]:
        if remote.name in self.remotes:
            raise XdcrRefused(f"remote cluster {remote.name!r} exists already")
        self.remotes[remote.name] = remote
        self._save()
        return remote.to_json(secrets=False)

    def remove_remote(self, name: str) -> dict[str, Any]:
        if name not in self.remotes:
            raise XdcrRefused(f"no remote cluster {name!r}")
        users = [r.id for r in self.replications.values() if r.to_cluster == name]
        if users:
            raise XdcrRefused(f"remote cluster {name!r} is used by {', '.join(users)}")
        del self.remotes[name]
        self._save()
        return {"removed": name}

    # -- replications -----------------------------------------------------------------------

    def create(self, rep: Replication) -> dict[str, Any]:
        if rep.to_cluster not in self.remotes:
            raise XdcrRefused(f"no remote cluster {rep.to_cluster!r}")
        if rep.id in self.replications:
            raise XdcrRefused(f"replication {rep.id!r} exists already")
        self.replications[rep.id] = rep
        self._save()
        if not rep.settings.paused:
            self._run(rep)
        return {"id": rep.id}

    async def change(self, rid: str, params: dict[str, Any]) -> dict[str, Any]:
        rep = self._replication(rid)
        new = replace(rep, settings=rep.settings.with_params(params))
        self.replications[rid] = new
        self._save()
        await self._halt(rid)
        if not new.settings.paused:
            self._run(new)
        return new.to_json()

    async def delete(self, rid: str) -> dict[str, Any]:
        self._replication(rid)
        await self._halt(rid)
        del self.replications[rid]
        self._save()
        self._checkpoint_file(rid).unlink(missing_ok=True)
        return {"deleted": rid}

    async def tasks(self) -> list[dict[str, Any]]:
        return [await self._task(rep) for rep in self.replications.values()]

    async def _task(self, rep: Replication) -> dict[str, Any]:
        running = self._running.get(rep.id)
        replicator = running.replicator if running else None
        stats: dict[str, Any] = dict(replicator.stats) if replicator else {}
        status = "paused" if rep.settings.paused else "running"
        if replicator is not None:
            with contextlib.suppress(Exception):  # a source node down: not worth failing on
                stats["changes_left"] = await within(replicator.changes_left(), 5)
            elapsed = max(time.monotonic() - running.started, 1e-9) if running else 1.0
            stats["rate_docs_per_s"] = round(stats.get("docs_written", 0) / elapsed, 1)
        return {
            "type": "xdcr", "id": rep.id, "status": status, "source": rep.from_bucket,
            "target": f"{rep.to_cluster}/{rep.to_bucket}", "stats": stats,
            "restarts": running.restarts if running else 0,
            "lastError": running.last_error if running else "", **rep.to_json(),
        }  # fmt: skip

    def _replication(self, rid: str) -> Replication:
        rep = self.replications.get(rid)
        if rep is None:
            raise web.HTTPNotFound(reason=f"no replication {rid!r}")
        return rep

    # -- supervisors ------------------------------------------------------------------------

    def _run(self, rep: Replication) -> None:
        running = _Running()
        self._running[rep.id] = running
        running.task = asyncio.get_running_loop().create_task(self._supervise(rep, running))

    async def _halt(self, rid: str) -> None:
        running = self._running.pop(rid, None)
        if running is None or running.task is None:
            return
        running.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running.task

    async def _supervise(self, rep: Replication, running: _Running) -> None:
        remote = self.remotes[rep.to_cluster]
        while True:
            replicator = Replicator(
                rep.id, self._source_of(rep.from_bucket), remote.connection(rep.to_bucket),
                rep.settings, self._load_checkpoints(rep.id),
                functools.partial(self._save_checkpoints, rep.id),
            )  # fmt: skip
            running.replicator = replicator
            try:
                await replicator.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: restart later, from the checkpoints
                running.restarts += 1
                running.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("xdcr %s failed (%s); restarting in %g s", rep.id,
                            running.last_error, rep.settings.restart_interval_s)  # fmt: skip
            await asyncio.sleep(rep.settings.restart_interval_s)

    # -- the store --------------------------------------------------------------------------

    def _load(self) -> None:
        path = self.data_dir / STORE
        if not path.exists():
            return
        doc = json.loads(path.read_text())
        self.remotes = {r["name"]: RemoteCluster(**r) for r in doc.get("remotes", [])}
        reps = (Replication.from_json(r) for r in doc.get("replications", []))
        self.replications = {r.id: r for r in reps}

    def _save(self) -> None:
        doc = {
            "remotes": [r.to_json() for r in self.remotes.values()],
            "replications": [r.to_json() for r in self.replications.values()],
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / STORE
        atomic_write(path, json.dumps(doc, indent=1).encode(), path.with_suffix(".tmp"))

    def _checkpoint_file(self, rid: str) -> Path:
        return self.data_dir / CHECKPOINTS / (re.sub(r"[^A-Za-z0-9_.-]", "_", rid) + ".json")

    def _load_checkpoints(self, rid: str) -> CheckpointLog:
        path = self._checkpoint_file(rid)
        if not path.exists():
            return CheckpointLog()
        return CheckpointLog.from_json(json.loads(path.read_text()))

    def _save_checkpoints(self, rid: str, cps: CheckpointLog) -> None:
        path = self._checkpoint_file(rid)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(cps.to_json()).encode(), path.with_suffix(".tmp"))


# -- REST --------------------------------------------------------------------------------------

SERVICE = web.AppKey("xdcr", XdcrService)
Params = Callable[[web.Request], Any]


def add_routes(app: web.Application, service: XdcrService, params: Params) -> None:
    """The routes of the module docstring on the manager's app; ``params`` reads a request's
    form or JSON (the manager API's own reader)."""
    app[SERVICE] = service

    async def add_remote(request: web.Request) -> web.Response:
        p = await params(request)
        remote = RemoteCluster(
            name=_given(p, "name"), hostname=_given(p, "hostname"),
            username=_given(p, "username"), password=_given(p, "password"),
            tls_ca=p.get("certificate") or None,
        )  # fmt: skip
        return web.json_response(service.add_remote(remote))

    async def list_remotes(request: web.Request) -> web.Response:
        return web.json_response([r.to_json(secrets=False) for r in service.remotes.values()])

    async def remove_remote(request: web.Request) -> web.Response:
        return web.json_response(service.remove_remote(request.match_info["name"]))

    async def create(request: web.Request) -> web.Response:
        p = dict(await params(request))
        if p.pop("replicationType", "continuous") != "continuous":
            raise XdcrRefused("replicationType must be continuous")
        rep = Replication(
            p.pop("fromBucket", "") or _given(p, "fromBucket"),
            p.pop("toCluster", "") or _given(p, "toCluster"),
            p.pop("toBucket", "") or _given(p, "toBucket"),
            ReplicationConfig().with_params(p),
        )
        return web.json_response(service.create(rep))

    async def change(request: web.Request) -> web.Response:
        return web.json_response(
            await service.change(request.match_info["id"], dict(await params(request)))
        )

    async def cancel(request: web.Request) -> web.Response:
        return web.json_response(await service.delete(request.match_info["id"]))

    async def tasks(request: web.Request) -> web.Response:
        return web.json_response(await service.tasks())

    app.router.add_post("/pools/default/remoteClusters", add_remote)
    app.router.add_get("/pools/default/remoteClusters", list_remotes)
    app.router.add_delete("/pools/default/remoteClusters/{name}", remove_remote)
    app.router.add_post("/controller/createReplication", create)
    app.router.add_post("/settings/replications/{id:.+}", change)
    app.router.add_delete("/controller/cancelXDCR/{id:.+}", cancel)
    app.router.add_get("/pools/default/tasks", tasks)


def _given(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not value:
        raise XdcrRefused(f"missing parameter {name!r}")
    return str(value)

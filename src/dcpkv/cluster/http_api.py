"""The manager's HTTP/JSON admin API (Couchbase's REST port, the parts this cluster has).

Theory of operation
-------------------
An aiohttp application over one :class:`~dcpkv.cluster.manager.Manager`:

=======  ============================  ===========================================
GET      ``/pools/default``            status: nodes, health, actives/replicas, lag
POST     ``/controller/addNode``       ``hostname=host:port``: validate and add a node
POST     ``/controller/failOver``      ``otpNode=host:port``: fail a node over
GET      ``/settings/autoFailover``    ``{"enabled":..,"timeout":..}``
POST     ``/settings/autoFailover``    ``enabled=true|false``, ``timeout=SECONDS``
POST     ``/settings/autoFailover/     acknowledge automatic failovers: the count
         resetCount``                  back to 0 (Couchbase's route)
POST     ``/controller/rebalance``     start a rebalance; ``ejectedNodes=a,b``: nodes
                                       to take out (graceful removal)
POST     ``/controller/stopRebalance`` stop it (running moves put back)
GET      ``/pools/default/             state, vbuckets moved of total, items
         rebalanceProgress``           transferred, elapsed and estimated seconds
POST     ``/controller/                ``otpNode=``, ``recoveryType=delta|full``: a
         setRecoveryType``             failed-over node comes back at the next rebalance
POST     ``/settings/rebalance``       ``movesAtOnce=N``: vbucket moves in flight
GET      ``/settings/rollbackRepair``  ``{"repairOnRollback": ..}``
POST     ``/settings/rollbackRepair``  ``repairOnRollback=true|false`` (spec 002's repair)
GET      ``/settings/rbac/users``      the users and their roles (never verifiers)
PUT      ``/settings/rbac/users/       ``password=..``, ``roles=data_reader[b],..``:
         local/NAME``                  add a user or change one (Couchbase's route)
DELETE   ``/settings/rbac/users/       remove a user
         local/NAME``
GET      ``/metrics``                  Prometheus text (:mod:`dcpkv.cluster.metrics`)
GET      ``/prometheus_sd_config``     Prometheus HTTP service discovery: the
                                       manager and every node's metrics port
GET      ``/ui/``                      the web console (:mod:`dcpkv.cluster.console`)
=======  ============================  ===========================================

Parameters come as a form (what Couchbase's REST API takes) or as a JSON object. Every
request needs HTTP basic auth with the cluster admin's user and password (the same login the
data nodes take); the two Prometheus routes also take a user of the cluster's users whose
roles grant ``stats_export`` (``external_stats_reader``: :mod:`dcpkv.core.rbac`). Answers are
JSON (but ``/metrics``), errors ``{"error": message}`` with 400 (bad input or a refused
change: nothing changed), 401 (no or wrong credentials, logged as an ``auth_failure`` event)
or 404.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dcpkv.cluster import console, metrics
from dcpkv.cluster.config import ClusterConfigError, Recovery
from dcpkv.cluster.manager import Manager, Refused
from dcpkv.core import logs
from dcpkv.core.rbac import Grants, Privilege, check_user_name, parse_roles

log = logging.getLogger("dcpkv.cluster")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MANAGER = web.AppKey("manager", Manager)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


STATS_PATHS = frozenset({"/metrics", "/prometheus_sd_config"})
_STATS_EXPORT = frozenset({Privilege.STATS_EXPORT})


def _credentials(request: web.Request) -> str | None:
    """``user:password`` of the request's basic auth, None when it has none."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def _authorized(request: web.Request, manager: Manager) -> bool:
    given = _credentials(request)
    if given is None:
        return False
    if hmac.compare_digest(given.encode(), f"{manager.user}:{manager.password}".encode()):
        return True
    if request.path not in STATS_PATHS:
        return False
    name, _, password = given.partition(":")
    record = manager.users.users.get(name)
    return (
        record is not None
        and Grants.of(record.roles).allows(_STATS_EXPORT, None)
        and record.check_password(password)
    )


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    manager = request.app[MANAGER]
    if not _authorized(request, manager):
        peer = request.remote or "?"
        logs.event(log, "auth_failure", "HTTP %s %s from %s refused: no or wrong credentials",
                   request.method, request.path, peer, level=logging.WARNING, peer=peer,
                   path=request.path)  # fmt: skip
        response = error(401, "authentication required (the cluster admin's user and password)")
        response.headers["WWW-Authenticate"] = 'Basic realm="dcpkv"'
        return response
    try:
        return await handler(request)
    except (Refused, ClusterConfigError, ValueError) as exc:
        return error(400, str(exc))
    except web.HTTPException as exc:
        return error(exc.status, exc.reason)


async def _params(request: web.Request) -> dict[str, Any]:
    if request.content_type == "application/json":
        try:
            doc = await request.json()
        except json.JSONDecodeError as exc:
            raise ValueError(f"the body is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError("the body must be a JSON object")
        return doc
    return dict(await request.post())


read_params = _params  # (the XDCR routes read theirs the same way: cluster/xdcr/service.py)


def _required(params: dict[str, Any], *names: str) -> str:
    for name in names:
        if params.get(name):
            return str(params[name])
    raise ValueError(f"missing parameter {names[0]!r}")


async def _status(request: web.Request) -> web.Response:
    return web.json_response(await request.app[MANAGER].status())


async def _add_node(request: web.Request) -> web.Response:
    name = _required(await _params(request), "hostname")
    return web.json_response(await request.app[MANAGER].add_node(name))


async def _fail_over(request: web.Request) -> web.Response:
    name = _required(await _params(request), "otpNode", "node")
    # Couchbase names nodes ns_1@host; a node here is its host:port
    return web.json_response(await request.app[MANAGER].failover(name.removeprefix("ns_1@")))


async def _get_auto_failover(request: web.Request) -> web.Response:
    return web.json_response(request.app[MANAGER].config.settings.to_json())


async def _set_auto_failover(request: web.Request) -> web.Response:
    params = await _params(request)
    current = request.app[MANAGER].config.settings
    enabled = _flag(params.get("enabled", current.auto_failover_enabled))
    try:
        timeout = int(params.get("timeout", current.auto_failover_timeout_s))
    except (TypeError, ValueError):
        given = params["timeout"]
        raise ValueError(f"timeout must be a number of seconds, not {given!r}") from None
    return web.json_response(await request.app[MANAGER].set_auto_failover(enabled, timeout))


async def _reset_auto_failover_count(request: web.Request) -> web.Response:
    return web.json_response(await request.app[MANAGER].reset_auto_failover_count())


async def _rebalance(request: web.Request) -> web.Response:
    params = await _params(request)
    eject = str(params.get("ejectedNodes") or "")
    names = [n.strip().removeprefix("ns_1@") for n in eject.split(",") if n.strip()]
    return web.json_response(await request.app[MANAGER].rebalance(names))


async def _stop_rebalance(request: web.Request) -> web.Response:
    return web.json_response(await request.app[MANAGER].stop_rebalance())


async def _rebalance_progress(request: web.Request) -> web.Response:
    return web.json_response(request.app[MANAGER].rebalancer.status())


async def _set_recovery_type(request: web.Request) -> web.Response:
    params = await _params(request)
    name = _required(params, "otpNode", "node").removeprefix("ns_1@")
    how = _required(params, "recoveryType")
    try:
        recovery = Recovery(how)
    except ValueError:
        raise ValueError(f"recoveryType must be delta or full, not {how!r}") from None
    return web.json_response(await request.app[MANAGER].set_recovery(name, recovery))


async def _set_rebalance(request: web.Request) -> web.Response:
    given = _required(await _params(request), "movesAtOnce")
    try:
        moves = int(given)
    except ValueError:
        raise ValueError(f"movesAtOnce must be a number, not {given!r}") from None
    return web.json_response(await request.app[MANAGER].set_rebalance_moves(moves))


async def _get_rollback_repair(request: web.Request) -> web.Response:
    settings = request.app[MANAGER].config.settings
    return web.json_response({"repairOnRollback": settings.repair_on_rollback})


async def _set_rollback_repair(request: web.Request) -> web.Response:
    params = await _params(request)
    if "repairOnRollback" not in params:  # (not _required: a JSON false is a value)
        raise ValueError("missing parameter 'repairOnRollback'")
    enabled = _flag(params["repairOnRollback"], "repairOnRollback")
    return web.json_response(await request.app[MANAGER].set_repair_on_rollback(enabled))


async def _list_users(request: web.Request) -> web.Response:
    return web.json_response(request.app[MANAGER].list_users())


async def _put_user(request: web.Request) -> web.Response:
    params = await _params(request)
    name = request.match_info["name"]
    check_user_name(name)
    password = str(params["password"]) if params.get("password") else None
    roles = parse_roles(str(params["roles"])) if params.get("roles") else None
    return web.json_response(await request.app[MANAGER].set_user(name, password, roles))


async def _delete_user(request: web.Request) -> web.Response:
    return web.json_response(await request.app[MANAGER].remove_user(request.match_info["name"]))


async def _metrics(request: web.Request) -> web.Response:
    body = metrics.render(metrics.families(request.app[MANAGER]))
    return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})


async def _prometheus_sd_config(request: web.Request) -> web.Response:
    address = request.host  # as the scraper reached this manager
    return web.json_response(await metrics.sd_targets(request.app[MANAGER], address))


def _flag(value: object, name: str = "enabled") -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text not in ("true", "false"):
        raise ValueError(f"{name} must be true or false, not {value!r}")
    return text == "true"


def make_app(manager: Manager) -> web.Application:
    app = web.Application(middlewares=[_guard])
    app[MANAGER] = manager
    app.router.add_get("/pools/default", _status)
    app.router.add_post("/controller/addNode", _add_node)
    app.router.add_post("/controller/failOver", _fail_over)
    app.router.add_get("/settings/autoFailover", _get_auto_failover)
    app.router.add_post("/settings/autoFailover", _set_auto_failover)
    app.router.add_post("/settings/autoFailover/resetCount", _reset_auto_failover_count)
    app.router.add_post("/controller/rebalance", _rebalance)
    app.router.add_post("/controller/stopRebalance", _stop_rebalance)
    app.router.add_get("/pools/default/rebalanceProgress", _rebalance_progress)
    app.router.add_post("/controller/setRecoveryType", _set_recovery_type)
    app.router.add_post("/settings/rebalance", _set_rebalance)
    app.router.add_get("/settings/rollbackRepair", _get_rollback_repair)
    app.router.add_post("/settings/rollbackRepair", _set_rollback_repair)
    app.router.add_get("/settings/rbac/users", _list_users)
    app.router.add_put("/settings/rbac/users/local/{name}", _put_user)
    app.router.add_delete("/settings/rbac/users/local/{name}", _delete_user)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/prometheus_sd_config", _prometheus_sd_config)
    console.install(app, manager)
    return app

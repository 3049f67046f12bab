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
=======  ============================  ===========================================

Parameters come as a form (what Couchbase's REST API takes) or as a JSON object. Every
request needs HTTP basic auth with the cluster admin's user and password (the same login the
data nodes take); answers are JSON, errors ``{"error": message}`` with 400 (bad input or a
refused change: nothing changed), 401 (no or wrong credentials) or 404.
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

from dcpkv.cluster.config import ClusterConfigError, Recovery
from dcpkv.cluster.manager import Manager, Refused
from dcpkv.core.rbac import check_user_name, parse_roles

log = logging.getLogger("dcpkv.cluster")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MANAGER = web.AppKey("manager", Manager)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _authorized(request: web.Request, user: str, password: str) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        given = base64.b64decode(token, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return False
    expected = f"{user}:{password}"
    return hmac.compare_digest(given.encode(), expected.encode())


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    manager = request.app[MANAGER]
    if not _authorized(request, manager.user, manager.password):
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
    return app

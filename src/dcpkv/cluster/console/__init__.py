"""The web console: a page the manager serves at ``/ui/``, on its admin API's server and login.

Theory of operation
-------------------
:func:`install` adds to the admin API's application (:mod:`dcpkv.cluster.http_api`, whose
middleware asks every request for the cluster admin's basic auth, the console's too):

=======  ========================  ==============================================
GET      ``/ui/``                  the page (``static/index.html``)
GET      ``/ui/static/...``        its script, styles and the vendored libraries
GET      ``/ui/api/overview``      nodes, buckets, rebalance, failover
                                   (:mod:`.gather`; gathered at most once a second)
GET      ``/ui/api/dcp``           DCP connections and their backlog, per node
                                   (at most every five seconds)
=======  ========================  ==============================================

The page is Preact with htm (tagged templates: no build step) and uPlot for the charts, all
vendored under ``static/vendor/`` (versions and licences in its README). It polls the two
JSON routes and draws; its only writes are the admin API's own routes (rebalance, stop,
failover, recovery), each behind a confirmation.

A browser that holds the admin's login sends it to the manager whichever page makes the
request, so the API must not take a write another site's page sends: a request that changes
something (not GET, HEAD or OPTIONS) with an ``Origin`` other than the manager's own is
refused (403). Command-line clients send no ``Origin`` and are unaffected. The console's
responses forbid framing and carry a content security policy allowing its own files only
(plus the page's one inline script, its import map, by hash).
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from dcpkv.cluster.console.gather import Gatherer
from dcpkv.cluster.manager import Manager

STATIC = Path(__file__).parent / "static"
GATHERER = web.AppKey("console", Gatherer)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def install(app: web.Application, manager: Manager) -> None:
    gatherer = Gatherer(manager)
    app[GATHERER] = gatherer
    page = (STATIC / "index.html").read_bytes()
    app.middlewares.append(_same_origin(_policy(page)))
    app.router.add_get("/ui", _to_page)
    app.router.add_get("/ui/", _serve(page))
    app.router.add_get("/ui/api/overview", _overview)
    app.router.add_get("/ui/api/dcp", _dcp)
    app.router.add_static("/ui/static/", STATIC)

    async def close(_: web.Application) -> None:
        await gatherer.close()

    app.on_cleanup.append(close)


def _policy(page: bytes) -> str:
    """The console's content security policy: its own files, and the page's import map."""
    found = re.search(rb'<script type="importmap">(.*?)</script>', page, re.S)
    inline = ""
    if found is not None:
        digest = base64.b64encode(hashlib.sha256(found.group(1)).digest()).decode()
        inline = f" 'sha256-{digest}'"
    return (
        f"default-src 'self'; script-src 'self'{inline}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'none'"
    )


def _same_origin(policy: str) -> Middleware:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        foreign = origin is not None and urlsplit(origin).netloc != request.host
        if foreign and request.method not in SAFE_METHODS:
            message = f"a write from another site's page ({origin}) is refused"
            return web.json_response({"error": message}, status=403)
        response = await handler(request)
        if request.path.startswith("/ui"):
            response.headers["Content-Security-Policy"] = policy
            response.headers["X-Frame-Options"] = "DENY"
            response.headers["X-Content-Type-Options"] = "nosniff"
            response.headers["Cache-Control"] = "no-cache"
        return response

    return check


async def _to_page(request: web.Request) -> web.StreamResponse:
    return web.Response(status=302, headers={"Location": "/ui/"})


def _serve(page: bytes) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8")

    return handler


async def _overview(request: web.Request) -> web.Response:
    return web.json_response(await request.app[GATHERER].overview.get())


async def _dcp(request: web.Request) -> web.Response:
    return web.json_response(await request.app[GATHERER].dcp.get())

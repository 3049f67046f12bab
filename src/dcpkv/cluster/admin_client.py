"""The admin API's client: what ``dcpkv cluster status|add-node|failover|settings`` call.

Theory of operation
-------------------
One blocking function, :func:`admin_request`, runs one aiohttp request (basic auth as the
cluster admin, parameters as a form) in a private event loop and returns the JSON answer. An
``https://`` manager is verified against the system's CAs, or the CA file named by the
environment variable ``DCPKV_MANAGER_CA`` (every command that talks to the manager). A
manager that cannot be reached, or that answers an error, raises :class:`AdminError` carrying
the manager's own message, which the commands print as one line.
"""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any

import aiohttp

from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER
from dcpkv.core.errors import DcpkvError
from dcpkv.core.tls import TlsError, TlsSettings

TIMEOUT_S = 60.0  # a failover syncs every node: allow it time


class AdminError(DcpkvError):
    """The manager is unreachable or refused the request."""


def admin_request(
    url: str,
    method: str,
    path: str,
    *,
    user: str,
    password: str,
    params: dict[str, str] | None = None,
) -> dict[str, Any]:
    return asyncio.run(_request(url.rstrip("/"), method, path, user, password, params))


def admin_answer(
    url: str, method: str, path: str, *, params: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """:func:`admin_request` as the default cluster admin; None while the manager does not
    answer or refuses (for a caller that polls a cluster whose managers come and go)."""
    try:
        return admin_request(
            url, method, path, user=DEFAULT_USER, password=DEFAULT_PASSWORD, params=params
        )
    except AdminError:
        return None


async def _request(
    base: str, method: str, path: str, user: str, password: str, params: dict[str, str] | None
) -> dict[str, Any]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    headers = {"Authorization": f"Basic {token}"}
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    ca = os.environ.get("DCPKV_MANAGER_CA")
    try:
        ssl = TlsSettings(ca=ca).context() if ca else True
    except TlsError as exc:
        raise AdminError(f"DCPKV_MANAGER_CA: {exc}") from None
    try:
        async with (
            aiohttp.ClientSession(
                headers=headers, timeout=timeout, connector=aiohttp.TCPConnector(ssl=ssl)
            ) as session,
            session.request(method, base + path, data=params) as response,
        ):
            try:
                doc = await response.json(content_type=None)
            except ValueError:
                doc = {"error": (await response.text())[:200]}
            if response.status != 200:
                message = doc.get("error") if isinstance(doc, dict) else None
                raise AdminError(message or f"HTTP {response.status}")
            return doc
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise AdminError(f"cannot reach the manager at {base}: {exc or 'timeout'}") from None

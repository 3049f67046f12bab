"""``within``: an awaitable with a time limit, without ``asyncio.wait_for``'s flaw on 3.11.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives in the same loop
iteration as the awaited result (cpython issue 86296, fixed in 3.12 by rebuilding it on
``asyncio.timeout``): the cancelled task goes on as if nothing happened. A replication link
that reads with a time limit while changes keep arriving is cancelled at shutdown in exactly
that window, and the server then never stopped. ``asyncio.timeout`` has no such window, so
every time limit in the project goes through here (the lint bans ``asyncio.wait_for``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """``await awaitable``, raising TimeoutError after ``timeout`` seconds (None: no limit)."""
    async with asyncio.timeout(timeout):
        return await awaitable

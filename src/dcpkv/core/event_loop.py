"""The event loop of dcpkv's long-running loops: uvloop's when it is installed.

uvloop (libuv underneath, a declared dependency off Windows) runs the same asyncio programs
with less interpreter work per wake-up, read and write than the standard library's selector
loop: the server has always used it, and the client library's blocking facade and
``dcpkv stream`` use it too (measured: about 10 % less client CPU per streamed item). The
one-shot questions of other commands (a few round trips under ``asyncio.run``) gain nothing
from it and keep asyncio's loop. Where it
is missing (Windows, or uninstalled by hand) everything runs on asyncio's own loop, unchanged.
A program that embeds the async client library keeps the loop it chose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop (not set as the thread's current one): uvloop's when installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """:func:`asyncio.run` on :func:`new_event_loop`'s kind of loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)

"""dcpkv's own processes and threads run on uvloop's loop when it is installed."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from dcpkv.core import event_loop

UVLOOP = importlib.util.find_spec("uvloop") is not None


async def _loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(not UVLOOP, reason="uvloop is not installed")
def test_run_uses_uvloop_and_returns_the_result() -> None:
    assert event_loop.run(_loop_module()).startswith("uvloop")


@pytest.mark.skipif(not UVLOOP, reason="uvloop is not installed")
def test_new_event_loop_is_uvloop_and_not_current() -> None:
    loop = event_loop.new_event_loop()
    try:
        assert type(loop).__module__.startswith("uvloop")
        assert loop.run_until_complete(_loop_module()).startswith("uvloop")
    finally:
        loop.close()


def test_run_propagates_the_coroutine_error() -> None:
    async def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        event_loop.run(fail())

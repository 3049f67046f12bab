"""``within``: a time limit that never swallows a cancellation (asyncio.wait_for does on 3.11)."""

from __future__ import annotations

import asyncio

import pytest

from dcpkv.core.deadline import within


async def _cancel_as_the_result_lands() -> str:
    """A task awaiting ``within`` is cancelled in the very loop iteration its awaitable
    completes: the window in which 3.11's wait_for returns the result and forgets the cancel."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def reader() -> str:
        got = await within(fut, 10)
        return f"went on with {got}"

    task = asyncio.create_task(reader())
    for _ in range(3):
        await asyncio.sleep(0)  # the reader is now waiting
    fut.set_result(1)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "cancelled"


def test_a_cancellation_arriving_with_the_result_is_kept() -> None:
    assert asyncio.run(_cancel_as_the_result_lands()) == "cancelled"


def test_the_result_within_the_limit() -> None:
    async def quick() -> int:
        await asyncio.sleep(0)
        return 7

    assert asyncio.run(within(quick(), 1.0)) == 7
    assert asyncio.run(within(quick(), None)) == 7


def test_past_the_limit_timeout_error() -> None:
    with pytest.raises(TimeoutError):
        asyncio.run(within(asyncio.sleep(5), 0.01))

"""The console's sampling: one gathering per interval whoever asks, and rates from counters."""

from __future__ import annotations

import asyncio

import pytest

from dcpkv.cluster.console.sampling import Cached, Mutations, Rate, as_count


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_callers_within_the_interval_share_one_gathering() -> None:
    async def main() -> None:
        clock = Clock()
        gathered: list[int] = []
        release = asyncio.Event()

        async def gather() -> int:
            gathered.append(len(gathered) + 1)
            await release.wait()
            return gathered[-1]

        cached = Cached(gather, 1.0, clock)
        waiting = [asyncio.ensure_future(cached.get()) for _ in range(5)]
        await asyncio.sleep(0)
        release.set()
        assert await asyncio.gather(*waiting) == [1] * 5  # five callers, one gathering
        clock.now += 0.5
        assert await cached.get() == 1  # still fresh: kept
        clock.now += 0.6
        assert await cached.get() == 2  # stale: gathered again
        assert gathered == [1, 2]

    asyncio.run(main())


def test_a_failed_gathering_is_not_kept() -> None:
    async def main() -> None:
        answers: list[int | Exception] = [RuntimeError("node down"), 7]

        async def gather() -> int:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        cached = Cached(gather, 1.0, Clock())
        with pytest.raises(RuntimeError, match="node down"):
            await cached.get()
        assert await cached.get() == 7  # the next caller gathers again at once

    asyncio.run(main())


def test_a_caller_going_away_does_not_cancel_the_gathering_others_wait_on() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def gather() -> str:
            await release.wait()
            return "figures"

        cached = Cached(gather, 1.0, Clock())
        leaving = asyncio.ensure_future(cached.get())
        staying = asyncio.ensure_future(cached.get())
        await asyncio.sleep(0)
        leaving.cancel()
        release.set()
        assert await staying == "figures"

    asyncio.run(main())


@pytest.mark.parametrize(
    ("samples", "rates"),
    [
        ([(0.0, 10)], [None]),  # no rate from one sample
        ([(0.0, 10), (2.0, 30)], [None, 10.0]),
        ([(0.0, 10), (1.0, 10)], [None, 0.0]),
        ([(0.0, 50), (1.0, 20), (2.0, 25)], [None, 0.0, 5.0]),  # went down: 0, then on from it
        ([(1.0, 5), (1.0, 9)], [None, None]),  # no time passed: no rate
    ],
)
def test_rate(samples: list[tuple[float, int]], rates: list[float | None]) -> None:
    rate = Rate()
    assert [rate.update(now, total) for now, total in samples] == rates


def test_mutations_count_each_vbucket_once_at_its_highest_seqno_seen() -> None:
    counter = Mutations()
    # the first sample: vbuckets never seen, so no rate yet
    assert counter.update(0.0, [{0: 10, 1: 20}, {2: 5}]) == (35, None)
    # a handover: vbucket 1 reported by two nodes counts once, at the higher seqno
    assert counter.update(1.0, [{0: 12, 1: 24}, {1: 23, 2: 5}]) == (41, 6.0)
    # vbucket 2 reported by no node (between owners): kept, not a drop
    assert counter.update(2.0, [{0: 14, 1: 24}]) == (43, 2.0)
    # a promoted replica below the old active's seqno: counted again once it passes it
    assert counter.update(3.0, [{0: 14, 1: 22, 2: 6}]) == (44, 1.0)


def test_mutations_start_the_rate_afresh_when_vbuckets_appear() -> None:
    counter = Mutations()
    counter.update(0.0, [{0: 10}])
    counter.update(1.0, [{0: 11}])
    # a node answers again with vbuckets never seen: their history is not a burst
    assert counter.update(2.0, [{0: 12, 1: 5_000}]) == (5_012, None)
    assert counter.update(3.0, [{0: 13, 1: 5_002}]) == (5_015, 3.0)


@pytest.mark.parametrize(("text", "count"), [("12", 12), ("", 0), (None, 0), ("n/a", 0)])
def test_as_count(text: str | None, count: int) -> None:
    assert as_count(text) == count

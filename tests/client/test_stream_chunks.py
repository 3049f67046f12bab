"""``Consumer.stream_chunks``: the stream's events in lists, with the same guarantees per list.

What must hold (the method's docstring): the same events as ``stream``; lists of at most
``most``; ``each`` sees the offsets exactly after its event; a decision event ends its list;
and an error raised while a list is made comes after the events made before it (their
offsets moved: losing them would lose data on resume). The last one is checked on the
chunking step itself, with hypothesis; the rest against a real server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from hypothesis import given
from hypothesis import strategies as st
from test_consumer_wire import config

from dcpkv.client import events
from dcpkv.client.consumer import Consumer, _take
from dcpkv.client.offsets import VbucketOffset
from support.clienthelp import Writer
from support.serverproc import ServerProcess

_DECISIONS = (events.Rollback, events.StreamRefused, events.StreamEnd, events.StreamStart)


class _Broken(Exception):
    pass


def _made(count: int, fail_at: int | None) -> Iterator[int]:
    for i in range(count):
        if i == fail_at:
            raise _Broken(i)
        yield i


@given(
    count=st.integers(0, 40),
    fail_at=st.one_of(st.none(), st.integers(0, 40)),
    most=st.integers(1, 12),
)
def test_every_event_made_before_an_error_comes_before_it(
    count: int, fail_at: int | None, most: int
) -> None:
    made = _made(count, fail_at)
    got: list[int] = []
    error = None
    while error is None:
        chunk, error = _take(made, most, lambda i: i * 10)  # type: ignore[arg-type]
        assert len(chunk) <= most
        got += chunk
        if error is None and len(chunk) < most:
            break
    stop = count if fail_at is None or fail_at >= count else fail_at
    assert got == [i * 10 for i in range(stop)]
    assert (error is not None) == (stop < count)
    if error is not None:
        assert isinstance(error, _Broken) and error.args == (stop,)


def test_lists_bounded_offsets_exact_at_each_and_decisions_end_lists(
    server: ServerProcess,
) -> None:
    w = Writer(server.port)
    for i in range(500):
        w.set(f"k{i}".encode(), b"v%d" % i)
    for i in range(0, 500, 7):
        w.delete(f"k{i}".encode())

    async def run() -> tuple[list[list[events.Event]], list[bool], list[events.Event]]:
        exact: list[bool] = []
        async with Consumer(config(server.port, "test:chunks")) as consumer:

            def each(ev: events.Event) -> events.Event:
                # right after the event was made: the offsets are exactly after it
                exact.append(consumer.offsets[ev.vbucket] == ev.offset)
                return ev

            lists = [chunk async for chunk in consumer.stream_chunks(end="now", each=each, most=16)]
            ends_at = {vb: consumer.offsets[vb] for vb in consumer.offsets}
        async with Consumer(config(server.port, "test:one-by-one")) as consumer:
            one_by_one = [ev async for ev in consumer.stream(end="now")]
            assert ends_at == {vb: consumer.offsets[vb] for vb in consumer.offsets}
        return lists, exact, one_by_one

    lists, exact, one_by_one = asyncio.run(run())
    assert all(1 <= len(chunk) <= 16 for chunk in lists)
    assert all(exact) and len(exact) == sum(map(len, lists))
    for chunk in lists:
        assert not any(isinstance(ev, _DECISIONS) for ev in chunk[:-1])
    assert _per_vbucket([ev for chunk in lists for ev in chunk]) == _per_vbucket(one_by_one)


def _per_vbucket(evs: list[events.Event]) -> dict[int, list[tuple[object, ...]]]:
    # vbuckets interleave as the producer sends them; each vbucket's own order is the contract
    out: dict[int, list[tuple[object, ...]]] = {}
    for ev in evs:
        key = getattr(ev, "key", None)
        offset: VbucketOffset = ev.offset
        out.setdefault(ev.vbucket, []).append((type(ev).__name__, key, offset.seqno))
    return out

"""A blocking facade over :class:`~dcpkv.client.consumer.Consumer`.

Theory of operation
-------------------
One event loop runs in a daemon thread for the facade's lifetime; every method submits a
coroutine to it (:func:`asyncio.run_coroutine_threadsafe`) and waits for the result. The
asyncio consumer keeps running between calls, so the connection's reader still answers
Noops while the application is busy with an event. :meth:`SyncConsumer.stream` pulls the
async iterator one event per ``next()``; closing the iterator (or the facade) closes the
async one inside the loop. :meth:`close` closes the consumer and stops the thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from dcpkv.client import events
from dcpkv.client.config import ClientConfig
from dcpkv.client.consumer import Consumer, End, Start
from dcpkv.client.mutation_log import MutationLog
from dcpkv.client.offsets import Offsets
from dcpkv.engine.failover_table import FailoverEntry

T = TypeVar("T")


class SyncConsumer:
    """Same constructor and methods as :class:`Consumer`, blocking."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        offsets: Offsets | None = None,
        mutation_log: MutationLog | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="dcpkv-client", daemon=True
        )
        self._thread.start()
        self._consumer = self._call(_make(config, offsets, mutation_log))
        self._closed = False

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._consumer.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    @property
    def consumer(self) -> Consumer:
        """The asyncio consumer underneath (use it only from the facade's loop)."""
        return self._consumer

    @property
    def offsets(self) -> Offsets:
        return self._consumer.offsets

    def vbucket_seqnos(self) -> dict[int, tuple[int, int]]:
        return self._call(self._consumer.vbucket_seqnos())

    def failover_log(self, vbucket: int) -> tuple[FailoverEntry, ...]:
        return self._call(self._consumer.failover_log(vbucket))

    def stream(
        self,
        vbuckets: Iterable[int] | None = None,
        *,
        start: Start = "beginning",
        end: End = "forever",
    ) -> Iterator[events.Event]:
        agen = self._consumer.stream(vbuckets, start=start, end=end)
        return self._iterate(agen)

    def _iterate(self, agen: Any) -> Iterator[events.Event]:
        try:
            while True:
                try:
                    yield self._call(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if not self._loop.is_closed() and self._loop.is_running():
                self._call(agen.aclose())


async def _make(
    config: ClientConfig, offsets: Offsets | None, mutation_log: MutationLog | None
) -> Consumer:
    # Built inside the loop: the consumer's asyncio objects belong to that loop.
    return Consumer(config, offsets=offsets, mutation_log=mutation_log)

"""A driver's kept connection for its planning questions (seqnos, failover logs, the map).

Theory of operation
-------------------
The stream reader asks the server a few questions per batch, and so do the pipelines' batch
functions (the lag after a commit, the high seqnos of a resync). A new
:class:`~dcpkv.client.sync.SyncConsumer` per question costs a thread, a connection and an
authentication each; :class:`DriverLink` keeps one across batches instead. A question that
fails on the kept connection (the server restarted, a node left) is asked once more on a new
one. It is pickled without its connection (a stream reader goes to the tasks), and
:meth:`DriverLink.close` ends it when its owner stops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from dcpkv.client.settings import ClientSettings

if TYPE_CHECKING:
    from dcpkv.client.sync import SyncConsumer

T = TypeVar("T")


def link_errors() -> tuple[type[BaseException], ...]:
    """What makes a question worth asking again on a new connection. (The client library is
    imported when a link is first used, not with this module: a planner process that only
    builds a stream reader, as Spark's do, never loads it.)"""
    from dcpkv.client.connection import ClientError

    return (ClientError, ConnectionError, OSError, TimeoutError)


class HasClientSettings(Protocol):
    """Whatever says how to connect (the source's options, a pipeline's source settings)."""

    def client_settings(self) -> ClientSettings: ...


class DriverLink:
    """One kept :class:`SyncConsumer` for a driver's questions (module docstring)."""

    def __init__(self, opts: HasClientSettings) -> None:
        self.opts = opts
        self._consumer: SyncConsumer | None = None

    def ask(self, question: Callable[[SyncConsumer], T]) -> T:
        try:
            return question(self._open())
        except link_errors():
            self.close()
            return question(self._open())

    def _open(self) -> SyncConsumer:
        if self._consumer is None:
            from dcpkv.client.sync import SyncConsumer

            self._consumer = SyncConsumer(self.opts.client_settings())
        return self._consumer

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):  # a broken connection: nothing to flush
                consumer.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_consumer": None}

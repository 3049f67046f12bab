"""A small TCP proxy in front of each node, so the fault suite can cut and delay its links.

The cluster is built from the proxies' addresses: the manager knows each node by its proxy, so
the map names the proxies, and every link to a node goes through one (clients bootstrap from a
proxy and follow the map, replicas stream from the map's active, the manager drives each node
through its proxy). :meth:`LinkProxy.cut` closes every connection through a proxy at once;
:meth:`LinkProxy.delay` holds every chunk for a while before passing it on, in both directions
(a slow or congested link). The proxies run on one asyncio loop in a thread of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

CHUNK = 1 << 16


class LinkProxy:
    """Listens on a free port; forwards each connection to ``target_port`` (the node)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, target_port: int) -> None:
        self.loop = loop
        self.target_port = target_port
        self.port = 0
        self.delay_s = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()  # the node is down: as if the connection were refused
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                writer.write(data)
                await writer.drain()
        writer.close()

    def _cut(self) -> None:
        for w in list(self._writers):
            w.transport.abort()

    def cut(self) -> None:
        """Close every connection through this proxy now (from any thread)."""
        self.loop.call_soon_threadsafe(self._cut)

    def delay(self, seconds: float) -> None:
        self.delay_s = seconds


class Proxies:
    """The proxies of a cluster, and the loop thread they run on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet_cancellations)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.by_port: dict[int, LinkProxy] = {}  # node port -> its proxy

    def add(self, node_port: int) -> LinkProxy:
        proxy = LinkProxy(self.loop, node_port)
        asyncio.run_coroutine_threadsafe(proxy.start(), self.loop).result(timeout=10)
        self.by_port[node_port] = proxy
        return proxy

    def close(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        with contextlib.suppress(Exception):
            future.result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    async def _shutdown(self) -> None:
        for proxy in self.by_port.values():
            if proxy._server is not None:
                proxy._server.close()
            proxy._cut()
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _quiet_cancellations(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """Connections cancelled at shutdown are expected; anything else is reported."""
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)

"""A small TCP proxy in front of each node, so the fault suite can cut and delay its links.

The cluster is built from the proxies' addresses: the manager knows each node by its proxy, so
the map names the proxies, and every link to a node goes through one (clients bootstrap from a
proxy and follow the map, replicas stream from the map's active, the manager drives each node
through its proxy). :meth:`LinkProxy.cut` closes every connection through a proxy at once;
:meth:`LinkProxy.delay` holds every chunk for a while before passing it on, in both directions
(a slow or congested link). :meth:`LinkProxy.partition` cuts the link off until
:meth:`LinkProxy.heal`: either *silently* (every byte held where it is, new connections left
waiting, as a network that drops every packet; TCP delivers what was held once it heals) or
*refused* (every connection reset and each new one closed at once, as a firewall rejecting).
The proxies run on one asyncio loop in a thread of their own; :meth:`Proxies.link` makes one
to any port (the managers' links to etcd, ``chaos.py --etcd``).
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
        self.refusing = False  # partitioned, refused: connections closed at once
        self._open = asyncio.Event()  # cleared while partitioned (silently or refused)
        self._open.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        await self._open.wait()  # (partitioned silently: the connection hangs until healed)
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
                await self._open.wait()
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

    def partition(self, *, refused: bool) -> None:
        """Cut the link off until :meth:`heal`: silently, or refused (see the module)."""
        self.loop.call_soon_threadsafe(self._partition, refused)

    def _partition(self, refused: bool) -> None:
        self._open.clear()
        self.refusing = refused
        if refused:
            self._cut()

    def heal(self) -> None:
        self.loop.call_soon_threadsafe(self._heal)

    def _heal(self) -> None:
        self.refusing = False
        self._open.set()


class Proxies:
    """The proxies of a cluster, and the loop thread they run on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet_cancellations)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.by_port: dict[int, LinkProxy] = {}  # node port -> its proxy
        self.links: list[LinkProxy] = []  # the others (made by link)

    def add(self, node_port: int) -> LinkProxy:
        proxy = self.link(node_port)
        self.links.remove(proxy)
        self.by_port[node_port] = proxy
        return proxy

    def link(self, target_port: int) -> LinkProxy:
        """A proxy to ``target_port`` that is no node's (several may lead to one port)."""
        proxy = LinkProxy(self.loop, target_port)
        asyncio.run_coroutine_threadsafe(proxy.start(), self.loop).result(timeout=10)
        self.links.append(proxy)
        return proxy

    def close(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        with contextlib.suppress(Exception):
            future.result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    async def _shutdown(self) -> None:
        for proxy in [*self.by_port.values(), *self.links]:
            proxy._heal()  # (connections waiting on a partition end with the loop's tasks)
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

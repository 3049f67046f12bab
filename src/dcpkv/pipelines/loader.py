"""Loading the sample data set into a node, once, and a light writer that keeps data moving.

Theory of operation
-------------------
:func:`load_sample` writes :func:`~dcpkv.pipelines.sample_data.documents` through the sink's
pipelined :class:`~dcpkv.client.writer.KVWriter` in chunks (a chunk is many pipelined
windows), reporting progress after each chunk and checking whether it should stop, so a
Ctrl-C during a big load is honoured within one chunk. Only when every document is written
does it write a *marker* document (:data:`MARKER_KEY`: the size and seed of the sample).
A re-run finds the marker and skips the load instead of blindly rewriting the same data (and
pushing the same documents through the change stream again); an interrupted load has no
marker, so it is done again (Set is idempotent). The marker is an ordinary document: a mirror
of the bucket holds it too, which keeps "the mirror equals the bucket" literally true.

:class:`ChangeGenerator` is a thread that writes :func:`~dcpkv.pipelines.sample_data.changes`
(updates, new orders, cancellations) at a steady rate: it computes how many changes are due
since it started and writes them in one pipelined call every tick, so a slow tick is caught up
rather than lost, and stopping it (an event) takes at most one tick.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dcpkv.client.blocking import BlockingKV
from dcpkv.client.cluster import ClusterKV
from dcpkv.client.durability import DurabilityOption
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.client.writer import KVWriter, WriteOp
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.pipelines.sample_data import changes, documents

MARKER_KEY = b"_dcpkv::sample"
LOAD_CHUNK = 4096
GENERATOR_TICK_S = 0.1


@dataclass(frozen=True)
class SampleInfo:
    """What the marker says: the sample's size and seed."""

    docs: int
    seed: int


def bucket_vbuckets(ep: ConnectionSettings) -> tuple[int, int]:
    """(active vbuckets, items) of the bucket, from the general stats."""
    with BlockingKV.connect(ep) as session:
        stats = dict(session.stats(""))
    return int(stats["vb_active_num"]), int(stats["curr_items"])


def loaded_sample(ep: ConnectionSettings, num_vbuckets: int) -> SampleInfo | None:
    """The sample the bucket already holds (its marker), or None."""

    async def read() -> bytes | None:
        session = await ClusterKV.open(ClientSettings(ep))
        try:
            doc = await session.get(vbucket_for_key(MARKER_KEY, num_vbuckets), MARKER_KEY)
        finally:
            await session.close()
        return None if doc is None else doc.value

    value = asyncio.run(read())
    if value is None:
        return None
    marker = json.loads(value)
    return SampleInfo(docs=int(marker["docs"]), seed=int(marker["seed"]))


def load_sample(
    ep: ConnectionSettings,
    num_vbuckets: int,
    total: int,
    *,
    seed: int = 42,
    on_progress: Callable[[int], None] = lambda n: None,
    should_stop: Callable[[], bool] = lambda: False,
    durability: DurabilityOption = None,
) -> bool:
    """Write the sample, then its marker; False when stopped before the end (no marker).
    With ``durability`` every write is a SyncWrite of that level (:mod:`dcpkv.client.
    durability`)."""
    with KVWriter(ep, num_vbuckets, durability=durability) as writer:
        chunk: list[WriteOp] = []
        for key, value in documents(total, seed):
            chunk.append(WriteOp(key, value=value))
            if len(chunk) == LOAD_CHUNK:
                writer.write(chunk)
                on_progress(len(chunk))
                chunk = []
                if should_stop():
                    return False
        writer.write(chunk)
        on_progress(len(chunk))
        marker = {"docs": total, "seed": seed, "loaded_at": time.time()}
        writer.write([WriteOp(MARKER_KEY, value=json.dumps(marker).encode())])
    return True


class ChangeGenerator(threading.Thread):
    """Writes ``rate`` sample changes per second until :meth:`stop`."""

    def __init__(
        self, ep: ConnectionSettings, num_vbuckets: int, total: int, *, rate: float, seed: int,
        durability: DurabilityOption = None,
    ) -> None:  # fmt: skip
        super().__init__(name="dcpkv-change-generator", daemon=True)
        self.ep = ep
        self.num_vbuckets = num_vbuckets
        self.total = total
        self.rate = rate
        self.seed = seed
        self.durability = durability
        self.written = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported by the job; the pipelines keep running
            self.error = exc

    def _run(self) -> None:
        stream = changes(self.total, self.seed)
        started = time.monotonic()
        with KVWriter(self.ep, self.num_vbuckets, durability=self.durability) as writer:
            while not self._stop_event.wait(GENERATOR_TICK_S):
                due = int((time.monotonic() - started) * self.rate) - self.written
                ops = [
                    WriteOp(key, delete=True) if doc is None else WriteOp(key, value=doc)
                    for key, doc in (next(stream) for _ in range(max(0, due)))
                ]
                writer.write(ops)
                self.written += len(ops)

"""Where a benchmark's processes run: the client on one CPU, its servers on the others.

Why: on this host a fresh server's speed depended on where the scheduler put it and its
client, and on how often it moved them (a task moved to an idle CPU runs at that CPU's slow
speed for up to 0.3 s). Unpinned, ``bench/dcp.py``'s Snappy-stored backfill ranged 279-435k
items/s over six starts of the same commit; with the client on CPU 0 and the server on
CPU 1, 478-525k over three. Rounds inside one start do not remove it, a fixed placement does.

So, under :func:`~_report.bench_main`, the benchmark process (the client, and what it starts
without saying: the ``dcpkv stream`` CLI, Spark's JVM and workers) runs on
:data:`CLIENT_CPUS`, and every server, manager, cluster or peer server it starts runs on
:data:`SERVER_CPUS` (``dcpkv demo`` too, its node and its Spark: the pipeline under test):
a benchmark starts them inside ``with servers():``. The yardstick's own
processes start inside ``with everywhere():`` and place themselves as before (the probe on
the busiest CPU, the latency yardstick's two ends one per CPU).

Affinity is a thread's and a child inherits its parent thread's: ``servers()`` moves the
calling thread for the block and back after it, so a server started (forked) in the block,
and every thread and child it starts, stays on the server CPUs.

On a machine of one CPU, or with ``DCPKV_BENCH_PLACEMENT=off`` in the environment (to
compare), nothing is pinned.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

ENV = "DCPKV_BENCH_PLACEMENT"


def _split(cpus: set[int]) -> tuple[set[int], set[int]]:
    """(client, servers): the lowest CPU for the client, the rest for the servers; all for
    both when there is one CPU."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        return set(ordered), set(ordered)
    return {ordered[0]}, set(ordered[1:])


ALL_CPUS: set[int] = os.sched_getaffinity(0)
CLIENT_CPUS, SERVER_CPUS = _split(ALL_CPUS)
_pinned = False  # pin_client() has run: servers() and everywhere() move the thread


def enabled() -> bool:
    return os.environ.get(ENV, "on").lower() not in ("off", "0", "no") and len(ALL_CPUS) > 1


def pin_client() -> bool:
    """Put the calling thread (the benchmark) on the client CPUs; whether it did."""
    global _pinned
    if enabled():
        os.sched_setaffinity(0, CLIENT_CPUS)
        _pinned = True
    return _pinned


@contextmanager
def _on(cpus: set[int]) -> Iterator[None]:
    if not _pinned:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def servers() -> AbstractContextManager[None]:
    """Processes started in the block run on the server CPUs (module docstring)."""
    return _on(SERVER_CPUS)


def everywhere() -> AbstractContextManager[None]:
    """Processes started in the block may run on every CPU (they place themselves)."""
    return _on(ALL_CPUS)


def server_threads(default: int) -> int:
    """Worker threads for a server that sizes its own pool (memcached's ``-t``): one per
    server CPU when placed, ``default`` otherwise (with its default four threads on the one
    server CPU, memcached's Set rate moved 0.74x between two runs; with one, 0.95-1.04x)."""
    return len(SERVER_CPUS) if _pinned else default

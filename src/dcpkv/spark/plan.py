"""Planning a micro-batch: where each vbucket's stream ends, and which task reads it.

Theory of operation
-------------------
Everything here is pure: the driver fetches the server's state (each vbucket's current branch
uuid and high seqno, one Stat round trip; failover logs only for vbuckets whose branch moved,
which :func:`batch_end` asks through the caller's ``ask``) and these functions turn it into
the batch's end offset and its partitions. Nothing here imports pyspark: the mirror's first
batch, written by the driver without Spark (``pipelines/first_batch.py``), plans with them
too. The same inputs always give the same plan, which Spark relies on when it re-runs a batch
from its offset log.

Where a vbucket restarts. A vbucket still on the branch its offset names resumes at its seqno.
One whose branch moved (the server restarted after losing unpersisted writes, or failed over)
is judged with the producer's own rule (``dcpkv.core.rollback.needs_rollback``) on the
current failover log: no rollback means it resumes at its seqno; a rollback to R means the
client will land on the newest consistent point ``p <= R`` the offset knows, and re-stream
from there. The "seqno distance" of a vbucket is its high seqno minus that restart point: an
upper bound on the changes it can send (deduplication only makes it smaller).

Admission control (``maxChangesPerTrigger``) splits the budget over the vbuckets by water
filling: every vbucket gets an equal share, capped at its distance, and what a vbucket could
not use is shared again among the others. A share of less than one is given, one change each,
to the vbuckets with the most left to read, so no vbucket starves behind others. A vbucket
whose branch moved is always part of the batch, even with nothing to read: its rollback row is
news for downstream.

Partitions. The vbuckets to read are spread over ``numPartitions`` tasks (by default one per
:data:`CHANGES_PER_TASK` changes, 1 to 16, two from :data:`TWO_TASKS_FROM`), longest first
onto the least loaded task (by seqno distance): one vbucket is always read by one task, in
order.
On a cluster (:func:`spread_by_node`) a node's vbuckets are read together: the tasks are
shared out over the nodes in proportion to what each has to send, and a task reads from one
node only (one DCP connection, to the node holding its vbuckets active when planned; the
client library follows a vbucket that moves meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dcpkv.core.failover_table import FailoverEntry, FailoverTable
from dcpkv.core.rollback import needs_rollback
from dcpkv.spark.options import OptionError
from dcpkv.spark.sparkoffsets import SparkOffsets, VbPosition

DEFAULT_MAX_PARTITIONS = 16
# Without numPartitions, a task per this many changes (at least one, at most the maximum): a
# task's fixed cost (a Python worker's turn, a connection and login, a stream request per
# vbucket) is repaid only by that much work. A live batch of a few thousand changes over
# 1024 vbuckets is then one task, not sixteen, and the first batch of a large bucket is many.
CHANGES_PER_TASK = 50_000
# ... but a batch of this many changes gets two tasks at least: a first batch (a sample load
# of 30k documents) was one task on one core while the other idled, and the task's fixed cost
# is small next to 10k changes. (Live batches, smaller, stay one task.)
TWO_TASKS_FROM = 10_000


def default_tasks(work: Sequence[VbTarget]) -> int:
    """How many tasks a batch gets when the user did not say (``numPartitions``)."""
    total = sum(t.distance for t in work)
    least = 2 if total >= TWO_TASKS_FROM else 1
    return max(least, min(DEFAULT_MAX_PARTITIONS, -(-total // CHANGES_PER_TASK)))


@dataclass(frozen=True, slots=True)
class VbTarget:
    """One vbucket of a batch: read from ``start`` to seqno ``end`` (``distance`` to go)."""

    vbucket: int
    start: VbPosition
    end: int
    distance: int


def branch_moved(pos: VbPosition, current_uuid: int) -> bool:
    o = pos.offset
    return not (o.vb_uuid == current_uuid or (o.seqno == 0 and o.vb_uuid == 0))


def restart_point(pos: VbPosition, log: Sequence[FailoverEntry], high: int) -> int:
    """Where the client will resume a vbucket whose branch moved (see module docstring)."""
    o = pos.offset
    decision = needs_rollback(
        start=o.seqno,
        vb_uuid=o.vb_uuid,
        snap_start=o.snap_start,
        snap_end=o.snap_end,
        purge_seqno=0,
        failover_table=FailoverTable(log, capacity=max(1, len(log))),
        high_seqno=high,
    )
    if decision is None:
        return o.seqno
    candidates = [0, *pos.points]
    if o.complete:
        candidates.append(o.seqno)
    return max(p for p in candidates if p <= decision.seqno)


def split_budget(distances: Mapping[int, int], budget: int | None) -> dict[int, int]:
    """How many seqnos each vbucket may advance: all of it without a budget, else water
    filling (see the module docstring). The total never exceeds ``budget``."""
    if budget is None:
        return dict(distances)
    alloc = dict.fromkeys(distances, 0)
    remaining = budget
    active = sorted(vb for vb, d in distances.items() if d > 0)
    # Each round either exhausts a vbucket or leaves less than one change per vbucket.
    while remaining > 0 and active:
        share = remaining // len(active)
        if share == 0:
            by_need = sorted(active, key=lambda vb: (alloc[vb] - distances[vb], vb))
            for vb in by_need[:remaining]:
                alloc[vb] += 1
            break
        for vb in active:
            take = min(share, distances[vb] - alloc[vb])
            alloc[vb] += take
            remaining -= take
        active = [vb for vb in active if alloc[vb] < distances[vb]]
    return alloc


def plan_end(
    start: SparkOffsets,
    current: Mapping[int, tuple[int, int]],
    logs: Mapping[int, Sequence[FailoverEntry]],
    budget: int | None,
) -> SparkOffsets:
    """The end offset of the next batch from ``start`` (``current``: vb -> (uuid, high))."""
    restarts: dict[int, int] = {}
    distances: dict[int, int] = {}
    for vb, pos in start.items():
        uuid, high = current[vb]
        moved = branch_moved(pos, uuid)
        restart = restart_point(pos, logs.get(vb, ()), high) if moved else pos.offset.seqno
        rolled = restart < pos.offset.seqno
        if rolled or high > restart:
            restarts[vb] = restart
            distances[vb] = max(0, high - restart)
    alloc = split_budget(distances, budget)
    out = dict(start)
    for vb, restart in restarts.items():
        pos = start[vb]
        end = restart + alloc[vb]
        if end == pos.offset.seqno and restart == end:
            continue  # nothing to read, nothing rolled back: leave the position as it is
        out[vb] = pos.advanced_to(end, current[vb][0], valid_to=restart)
    return SparkOffsets(out)


def batch_end(
    begin: SparkOffsets,
    seqnos: Mapping[int, tuple[int, int]],
    ask: Callable[[Callable[[Any], Any]], Any],
    budget: int | None,
) -> SparkOffsets:
    """The end of the micro-batch from ``begin`` (:func:`plan_end`) with the server's
    ``seqnos`` (vb -> (uuid, high)); ``ask`` puts a question to a consumer (a
    :meth:`~dcpkv.spark.link.DriverLink.ask`): the one question this asks the server, the
    failover logs of the vbuckets whose branch moved (the planning's only I/O besides the
    seqnos, so the streaming source and the mirror's first batch plan alike)."""
    missing = sorted(set(begin) - set(seqnos))
    if missing:
        raise OptionError(f"the offset names vbucket {missing[0]}, which the bucket lacks")
    current = {vb: seqnos[vb] for vb in begin}
    moved = [vb for vb, pos in begin.items() if branch_moved(pos, current[vb][0])]
    logs = ask(lambda c: c.failover_logs(moved)) if moved else {}
    return plan_end(begin, current, logs, budget)


def initial_offsets(
    starting: str | SparkOffsets, vbs: Sequence[int], seqnos: Mapping[int, tuple[int, int]]
) -> SparkOffsets:
    """``earliest``, ``latest`` (each vbucket's high seqno now), or given offsets (vbuckets
    they do not name start from the earliest)."""
    if starting == "latest":
        return SparkOffsets({vb: VbPosition.at(seqnos[vb][1], seqnos[vb][0]) for vb in vbs})
    earliest = SparkOffsets.earliest(vbs)
    if isinstance(starting, SparkOffsets):
        return SparkOffsets({vb: starting.get(vb, earliest[vb]) for vb in vbs})
    return earliest


def targets(start: SparkOffsets, end: SparkOffsets) -> list[VbTarget]:
    """The vbuckets a batch from ``start`` to ``end`` reads (those whose position moved)."""
    out = []
    for vb, end_pos in end.items():
        pos = start.get(vb)
        if pos is None or pos == end_pos:
            continue
        distance = max(0, end_pos.offset.seqno - min(pos.offset.seqno, end_pos.offset.seqno))
        out.append(VbTarget(vb, pos, end_pos.offset.seqno, distance))
    return out


def spread(work: Sequence[VbTarget], num_partitions: int | None) -> list[list[VbTarget]]:
    """Longest first onto the least loaded of ``num_partitions`` tasks; no empty task."""
    if not work:
        return []
    n = min(len(work), num_partitions or default_tasks(work))
    tasks: list[list[VbTarget]] = [[] for _ in range(n)]
    loads = [0] * n
    for t in sorted(work, key=lambda t: (-t.distance, t.vbucket)):
        i = min(range(n), key=lambda i: (loads[i], i))
        tasks[i].append(t)
        loads[i] += t.distance + 1  # +1: a vbucket costs a stream request even when empty
    for task in tasks:
        task.sort(key=lambda t: t.vbucket)
    return tasks


def spread_by_node(
    work: Sequence[VbTarget], num_partitions: int | None, node_of: Mapping[int, str]
) -> list[list[VbTarget]]:
    """:func:`spread`, node by node (module docstring); vbuckets ``node_of`` does not place
    (no active when planned) form a group of their own."""
    groups: dict[str, list[VbTarget]] = {}
    for t in work:
        groups.setdefault(node_of.get(t.vbucket, ""), []).append(t)
    if len(groups) <= 1:
        return spread(work, num_partitions)
    n = max(len(groups), min(len(work), num_partitions or default_tasks(work)))
    loads = {node: sum(t.distance + 1 for t in ts) for node, ts in groups.items()}
    total = sum(loads.values())
    tasks: list[list[VbTarget]] = []
    for node in sorted(groups):
        share = max(1, round(n * loads[node] / total))
        tasks.extend(spread(groups[node], share))
    return tasks

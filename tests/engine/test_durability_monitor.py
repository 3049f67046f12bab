"""The durability monitor: every case of its docstring's tables (A1-A13, P1-P10), as a table,
then its invariants over random histories, checked against a plain model.

A case builds a monitor, then runs steps: each is an event and what it must return (the
decisions, in order; ``None`` for an event that decides nothing; an exception class for a
refusal) or a check of the monitor's state. Prepare ``n`` has key ``kn`` and, on the active,
client cookie ``cn``. The active is node ``a``.

The invariants. Active side: nothing commits without a majority of each chain that includes
the chain's active (the active's own ack honouring its persistence fences); completions come
out in seqno order, as soon as the oldest prepare is satisfied (or doomed); every prepare ends
exactly once (commit, abort, or handed over when the vbucket steps down) and every waiting
client is answered exactly once. Replica side: the acknowledged seqno only rises, covers only
whole snapshots, covers a PersistToMajority prepare (or a disk snapshot) only once persisted,
and in the end covers every prepare.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dcpkv.core.replication_topology import (
    ReplicationTopology,
    TopologyError,
    topology_from_chains,
)
from dcpkv.core.status import Status
from dcpkv.engine import durability_monitor
from dcpkv.engine.durability_monitor import (
    REASON_IMPOSSIBLE,
    REASON_TIMEOUT,
    Abort,
    ActiveDurabilityMonitor,
    Ambiguous,
    Commit,
    Decision,
    DurabilityImpossible,
    DurabilityMonitorError,
    PassiveDurabilityMonitor,
    SeqnoAck,
    SyncWrite,
    SyncWriteInProgress,
)
from dcpkv.engine.item import EngineError
from dcpkv.protocol.constants import DurabilityLevel

Monitor = Any  # an ActiveDurabilityMonitor or a PassiveDurabilityMonitor, as the case says
Event = Callable[[Monitor], object]
L1, L2, L3 = (
    DurabilityLevel.Majority,
    DurabilityLevel.MajorityAndPersistToActive,
    DurabilityLevel.PersistToMajority,
)
NOTHING: list[Decision] = []


def k(n: int) -> bytes:
    return f"k{n}".encode()


def c(n: int) -> str:
    return f"c{n}"


# -- events -------------------------------------------------------------------------------


def prepare(
    n: int, level: DurabilityLevel = L1, *, timeout_ms: int | None = None, now: float = 0
) -> Event:
    """On the active: a client's durable write of key kn became prepare n."""
    return lambda m: m.add_prepare(n, k(n), level, now=now, timeout_ms=timeout_ms, cookie=c(n))


def ack(node: str, seqno: int) -> Event:
    return lambda m: m.seqno_ack(node, seqno)


def persisted(seqno: int) -> Event:
    return lambda m: m.persisted(seqno)


def tick(now: float) -> Event:
    return lambda m: m.tick(now)


def topology(*chains: list[str | None]) -> Event:
    return lambda m: m.set_topology(topology_from_chains(list(chains)))


def receive(
    n: int, level: DurabilityLevel = L1, *, key: int | None = None, disk: bool = False
) -> Event:
    """On a replica: prepare n (of key kn, or k<key>) arrived."""
    return lambda m: m.prepare(n, k(n if key is None else key), level, disk=disk)


def snapshot_end(seqno: int, *, disk: bool = False) -> Event:
    return lambda m: m.snapshot_end(seqno, disk=disk)


def dcp_commit(n: int, *, key: int | None = None, disk: bool = False) -> Event:
    return lambda m: m.commit(n, k(n if key is None else key), disk=disk)


def dcp_abort(n: int, *, disk: bool = False) -> Event:
    return lambda m: m.abort(n, k(n), disk=disk)


def check(read: Callable[[Monitor], object]) -> Event:
    """A step that reads the monitor's state (its expected value follows)."""
    return read


# -- decisions ----------------------------------------------------------------------------


def commit(n: int, *, client: bool = True) -> Commit:
    return Commit(n, k(n), c(n) if client else None)


def abort(n: int, reason: str = REASON_TIMEOUT, *, client: bool = True) -> Abort:
    return Abort(n, k(n), c(n) if client else None, reason)


def ambiguous(n: int) -> Ambiguous:
    return Ambiguous(c(n))


# -- monitors -----------------------------------------------------------------------------


def active(*chains: list[str | None], maybe_visible: tuple[int, ...] = ()) -> Callable[[], Monitor]:
    def make() -> ActiveDurabilityMonitor:
        monitor = ActiveDurabilityMonitor(
            "a", maybe_visible=[SyncWrite(n, k(n), L1) for n in maybe_visible]
        )
        if chains:
            assert monitor.set_topology(topology_from_chains(list(chains))) == NOTHING
        return monitor

    return make


def passive() -> PassiveDurabilityMonitor:
    return PassiveDurabilityMonitor()


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], Monitor]
    steps: list[tuple[Event, object]]


RS = ["a", "r1", "r2"]  # a chain of two replicas: a majority is the active and one replica

ACTIVE_CASES = [
    # A1: no SyncWrite without a possible topology (the engine asks durability_possible)
    Case("A1 no topology yet", active(), [(prepare(1), DurabilityImpossible)]),
    Case("A1 a replica slot empty", active(["a", None]), [(prepare(1), DurabilityImpossible)]),
    Case(
        "A1 three replicas",
        active(["a", "r1", "r2", "r3"]),
        [(check(lambda m: m.durability_possible), False), (prepare(1), DurabilityImpossible)],
    ),
    Case(
        "A1 a second chain without its majority",
        active(RS, ["b", None]),
        [(prepare(1), DurabilityImpossible)],
    ),
    Case(
        "A1 a key with a pending prepare",
        active(RS),
        [
            (prepare(1), NOTHING),
            (lambda m: m.add_prepare(2, k(1), L1, now=0), SyncWriteInProgress),
        ],
    ),
    Case(
        "A1 a seqno not above the last",
        active(RS),
        [(prepare(2), NOTHING), (prepare(1), DurabilityMonitorError)],
    ),
    Case("A1 level 0", active(RS), [(prepare(1, 0), ValueError)]),  # type: ignore[arg-type]
    Case("A1 a zero timeout", active(RS), [(prepare(1, timeout_ms=0), DurabilityMonitorError)]),
    # A2: the commit rule
    Case("A2 the active alone (no replica)", active(["a"]), [(prepare(1), [commit(1)])]),
    Case(
        "A2 a majority of three",
        active(RS),
        [(prepare(1), NOTHING), (ack("r2", 1), [commit(1)])],
    ),
    Case(
        "A2 null slots count in the length",
        active(["a", None, "r2"]),
        [(prepare(1), NOTHING), (ack("r2", 1), [commit(1)])],
    ),
    Case(
        "A2 one replica of one: both must ack",
        active(["a", "r1"]),
        [(prepare(1), NOTHING), (ack("r1", 1), [commit(1)])],
    ),
    Case(
        "A2 an ack covers every prepare below it, in order",
        active(RS),
        [
            (prepare(1), NOTHING),
            (prepare(3, L2), NOTHING),
            (prepare(5), NOTHING),
            (persisted(5), NOTHING),
            (ack("r1", 5), [commit(1), commit(3), commit(5)]),
        ],
    ),
    Case(
        "A2 replicas without the active do not commit",
        active(RS),
        [(prepare(1, L3), NOTHING), (ack("r1", 1), NOTHING), (ack("r2", 1), NOTHING)],
    ),
    Case(
        "A2 the second chain needs its majority too",
        active(["a", "b"], ["c", "a"]),
        [(prepare(1), NOTHING), (ack("b", 1), NOTHING), (ack("c", 1), [commit(1)])],
    ),
    Case(
        "A2 the second chain's active must ack",
        active(["a", "b", "c"], ["d", "b", "c"]),
        [
            (prepare(1), NOTHING),
            (ack("b", 1), NOTHING),
            (ack("c", 1), NOTHING),
            (ack("d", 1), [commit(1)]),
        ],
    ),
    Case(
        "A2 a second chain led by this node",
        active(["a", "b"], ["a", "c", "d"]),
        [(prepare(1), NOTHING), (ack("b", 1), NOTHING), (ack("d", 1), [commit(1)])],
    ),
    # A3: a timeout aborts the oldest prepare
    Case(
        "A3 the deadline passes",
        active(RS),
        [
            (prepare(1, timeout_ms=1000, now=10), NOTHING),
            (tick(10.999), NOTHING),
            (tick(11), [abort(1)]),
            (ack("r1", 1), NOTHING),
        ],
    ),
    Case(
        "A3 the bucket's default timeout",
        active(RS),
        [(prepare(1), NOTHING), (tick(29.9), NOTHING), (tick(30), [abort(1)])],
    ),
    Case(
        "A3 an aborted fence frees the prepares behind it",
        active(RS),
        [
            (prepare(1, L3, timeout_ms=1000), NOTHING),
            (prepare(2, L1, timeout_ms=5000), NOTHING),
            (ack("r1", 2), NOTHING),
            (check(lambda m: m.high_prepared_seqno), 0),
            (tick(1), [abort(1), commit(2)]),
            (check(lambda m: (m.high_prepared_seqno, m.high_completed_seqno)), (2, 2)),
        ],
    ),
    # A4: a later prepare times out before an earlier one: its client is answered at its
    # deadline, the prepare completes in its turn
    Case(
        "A4 satisfied by its turn: commits",
        active(RS),
        [
            (prepare(1, timeout_ms=5000), NOTHING),
            (prepare(2, timeout_ms=1000), NOTHING),
            (tick(1), [ambiguous(2)]),
            (tick(2), NOTHING),
            (ack("r1", 2), [commit(1), commit(2, client=False)]),
        ],
    ),
    Case(
        "A4 not satisfied by its turn: aborts",
        active(RS),
        [
            (prepare(1, timeout_ms=5000), NOTHING),
            (prepare(2, timeout_ms=1000), NOTHING),
            (tick(1), [ambiguous(2)]),
            (tick(5), [abort(1), abort(2, client=False)]),
        ],
    ),
    Case(
        "A4 the earlier commits: the doomed one aborts at once",
        active(RS),
        [
            (prepare(1, L3, timeout_ms=5000), NOTHING),
            (prepare(2, timeout_ms=1000), NOTHING),
            (tick(1), [ambiguous(2)]),
            (ack("r1", 1), NOTHING),
            (persisted(1), [commit(1), abort(2, client=False)]),
        ],
    ),
    # A5: a topology that cannot be satisfied dooms every prepare with a timeout
    Case(
        "A5 a replica goes: durability impossible",
        active(["a", "r1"]),
        [
            (prepare(1), NOTHING),
            (prepare(2), NOTHING),
            (topology(["a", None]), [abort(1, REASON_IMPOSSIBLE), abort(2, REASON_IMPOSSIBLE)]),
            (check(lambda m: m.durability_possible), False),
        ],
    ),
    Case(
        "A5 behind a maybe visible prepare: answered now, aborted in turn",
        active(["a", "r1"], maybe_visible=(1,)),
        [
            (prepare(2), NOTHING),
            (topology(["a", None]), [ambiguous(2)]),
            (topology(["a", "r1"]), NOTHING),
            (ack("r1", 1), [commit(1, client=False), abort(2, REASON_IMPOSSIBLE, client=False)]),
        ],
    ),
    # A6: a new topology judges everything again
    Case(
        "A6 nodes kept keep their acks",
        active(["a", "b"], ["c", "a"]),
        [(prepare(1), NOTHING), (ack("b", 1), NOTHING), (topology(["a", "b"]), [commit(1)])],
    ),
    Case(
        "A6 nodes that left lose their acks",
        active(["a", "b"], ["c", "a"]),
        [
            (prepare(1), NOTHING),
            (ack("b", 1), NOTHING),
            (topology(["a", "x"], ["c", "a"]), NOTHING),
            (ack("c", 1), NOTHING),
            (topology(["a", "b"], ["c", "a"]), NOTHING),
            (ack("b", 1), [commit(1)]),
        ],
    ),
    Case(
        "A6 a smaller chain commits what it already has",
        active(["a", "r1", "r2"], ["c", "r1"]),
        [(prepare(1), NOTHING), (ack("r1", 1), NOTHING), (topology(RS), [commit(1)])],
    ),
    Case(
        "A6 the topology names another active",
        active(RS),
        [(topology(["b", "a"]), TopologyError)],
    ),
    # A7: acks only rise, and never beyond the prepares there are
    Case(
        "A7 a lower ack is ignored",
        active(["a", "r1"]),
        [
            (prepare(1), NOTHING),
            (prepare(2), NOTHING),
            (ack("r1", 2), [commit(1), commit(2)]),
            (ack("r1", 1), NOTHING),
            (check(lambda m: m.ack_of("r1")), 2),
        ],
    ),
    Case(
        "A7 an ack does not cover prepares made after it",
        active(["a", "r1"]),
        [
            (prepare(1), NOTHING),
            (ack("r1", 10), [commit(1)]),
            (prepare(2), NOTHING),
            (ack("r1", 2), [commit(2)]),
        ],
    ),
    # A8: a replica may ack before the manager names it
    Case(
        "A8 an ack from a node in no chain counts once it joins",
        active(["a", "x"]),
        [(prepare(1), NOTHING), (ack("y", 1), NOTHING), (topology(["a", "y"]), [commit(1)])],
    ),
    Case("A9 an ack naming this node", active(RS), [(ack("a", 1), DurabilityMonitorError)]),
    # A10: the active's persistence moves its fences
    Case(
        "A10 MajorityAndPersistToActive waits for the active's persistence",
        active(RS),
        [
            (prepare(1, L2), NOTHING),
            (ack("r1", 1), NOTHING),
            (persisted(0), NOTHING),
            (persisted(1), [commit(1)]),
        ],
    ),
    Case(
        "A10 a fence holds back the Majority prepares behind it",
        active(RS),
        [
            (prepare(1, L3), NOTHING),
            (prepare(2, L1), NOTHING),
            (prepare(3, L3), NOTHING),
            (prepare(4, L1), NOTHING),
            (ack("r1", 4), NOTHING),
            (persisted(1), [commit(1), commit(2)]),
            (check(lambda m: m.high_prepared_seqno), 2),
            (persisted(4), [commit(3), commit(4)]),
        ],
    ),
    Case(
        "A10 a prepare persisted before it is tracked is no fence",
        active(RS),
        [(persisted(9), NOTHING), (prepare(5, L3), NOTHING), (ack("r1", 5), [commit(5)])],
    ),
    # A11: leaving the active state
    Case(
        "A11 every waiting client is answered ambiguous once",
        active(RS),
        [
            (prepare(1, timeout_ms=5000), NOTHING),
            (prepare(2, timeout_ms=1000), NOTHING),
            (prepare(3), NOTHING),
            (tick(1), [ambiguous(2)]),
            (lambda m: m.step_down()[0], [ambiguous(1), ambiguous(3)]),
            (check(lambda m: m.num_pending), 0),
        ],
    ),
    Case(
        "A11 the prepares go to the replica's monitor",
        active(RS),
        [
            (prepare(1, L3), NOTHING),
            (prepare(2), NOTHING),
            (persisted(1), NOTHING),
            (
                check(lambda m: _pending_after_step_down(m)),
                ([1, 2], 2, 0, [None, None]),
            ),
        ],
    ),
    # A12: maybe visible prepares (a promoted replica's, or warm-up's)
    Case(
        "A12 never times out, commits when satisfied",
        active(["a", "r1"], maybe_visible=(1, 2)),
        [
            (tick(1e9), NOTHING),
            (check(lambda m: m.pending(k(1)).maybe_visible), True),
            (ack("r1", 1), [commit(1, client=False)]),
            (prepare(3), NOTHING),
            (ack("r1", 3), [commit(2, client=False), commit(3)]),
        ],
    ),
    Case(
        "A12 the high completed seqno never falls",
        lambda: ActiveDurabilityMonitor(
            "a", high_completed_seqno=7, maybe_visible=[SyncWrite(5, k(5), L1)]
        ),
        [
            (topology(["a"]), [commit(5, client=False)]),
            (check(lambda m: m.high_completed_seqno), 7),
        ],
    ),
    # A13: reads of a key being re-committed
    Case(
        "A13 a maybe visible prepare's key is being re-committed until it commits",
        active(["a", "r1"], maybe_visible=(1,)),
        [
            (check(lambda m: m.re_committing(k(1))), True),
            (prepare(2), NOTHING),
            (check(lambda m: (m.re_committing(k(2)), m.re_committing(k(9)))), (False, False)),
            (ack("r1", 2), [commit(1, client=False), commit(2)]),
            (check(lambda m: m.re_committing(k(1))), False),
        ],
    ),
]


def _pending_after_step_down(m: ActiveDurabilityMonitor) -> tuple[object, ...]:
    _, replica = m.step_down()
    writes = [replica.pending(k(n)) for n in (1, 2)]
    return (
        [w.seqno for w in writes if w is not None],
        replica.high_prepared_seqno,
        replica.high_completed_seqno,
        [w.cookie for w in writes if w is not None],
    )


PASSIVE_CASES = [
    # P1: at a snapshot's end, Majority and MajorityAndPersistToActive prepares are acked;
    # PersistToMajority ones wait for persistence
    Case(
        "P1 nothing is acked before the snapshot's end",
        passive,
        [(receive(1), None), (receive(2, L2), None), (snapshot_end(2), [SeqnoAck(2)])],
    ),
    Case(
        "P1 a PersistToMajority prepare is a fence",
        passive,
        [
            (receive(1), None),
            (receive(2, L3), None),
            (receive(3), None),
            (snapshot_end(3), [SeqnoAck(1)]),
            (persisted(2), NOTHING),
            (persisted(3), [SeqnoAck(3)]),
        ],
    ),
    Case(
        "P1 a snapshot with no prepare acks nothing",
        passive,
        [(snapshot_end(5), NOTHING), (persisted(5), NOTHING)],
    ),
    # P2: a persisted snapshot passes every prepare in it
    Case(
        "P2 persisted before its end arrived",
        passive,
        [(receive(1, L3), None), (persisted(1), NOTHING), (snapshot_end(1), [SeqnoAck(1)])],
    ),
    Case(
        "P2 prepares of the next snapshot wait for its end",
        passive,
        [
            (receive(1, L3), None),
            (snapshot_end(1), NOTHING),
            (receive(2), None),
            (persisted(2), [SeqnoAck(1)]),
            (snapshot_end(3), [SeqnoAck(2)]),
        ],
    ),
    # P3, P4: a disk snapshot is acked only once persisted, at its end
    Case(
        "P3 a disk snapshot not persisted acks nothing",
        passive,
        [(receive(1, disk=True), None), (snapshot_end(5, disk=True), NOTHING)],
    ),
    Case(
        "P4 a persisted disk snapshot acks its end",
        passive,
        [
            (receive(1, disk=True), None),
            (snapshot_end(5, disk=True), NOTHING),
            (persisted(5), [SeqnoAck(5)]),
        ],
    ),
    Case(
        "P4 even without prepares",
        passive,
        [(persisted(7), NOTHING), (snapshot_end(7, disk=True), [SeqnoAck(7)])],
    ),
    # P5: snapshots are acked in order
    Case(
        "P5 a later snapshot waits for an earlier fence",
        passive,
        [
            (receive(1, L3), None),
            (snapshot_end(1), NOTHING),
            (receive(2), None),
            (snapshot_end(2), NOTHING),
            (persisted(1), [SeqnoAck(2)]),
        ],
    ),
    Case(
        "P5 an inherited HPS does not constrain the snapshots (a rollback went below it)",
        lambda: PassiveDurabilityMonitor(high_prepared_seqno=10),
        [(snapshot_end(9), NOTHING), (receive(11), None), (snapshot_end(11), [SeqnoAck(11)])],
    ),
    Case(
        "P5 a snapshot end not above the last",
        passive,
        [(snapshot_end(5), NOTHING), (snapshot_end(5), DurabilityMonitorError)],
    ),
    # P6: commits and aborts in order; a completed prepare is still a fence
    Case(
        "P6 completions in order",
        passive,
        [
            (receive(1), None),
            (receive(2), None),
            (dcp_commit(2), DurabilityMonitorError),
            (dcp_commit(1), None),
            (dcp_abort(2), None),
            (check(lambda m: (m.num_pending, m.high_completed_seqno)), (0, 2)),
            (dcp_abort(3), DurabilityMonitorError),
        ],
    ),
    Case(
        "P6 a commit naming another prepare seqno",
        passive,
        [(receive(1), None), (lambda m: m.commit(9, k(1)), DurabilityMonitorError)],
    ),
    Case(
        "P6 a committed PersistToMajority prepare still fences the acks",
        passive,
        [
            (receive(1, L3), None),
            (receive(2), None),
            (snapshot_end(2), NOTHING),
            (dcp_commit(1), None),
            (persisted(1), NOTHING),
            (persisted(2), [SeqnoAck(2)]),
        ],
    ),
    # P7: a disk snapshot may have deduplicated prepares and completions
    Case(
        "P7 out of order in a disk snapshot",
        passive,
        [
            (receive(1, disk=True), None),
            (receive(2, disk=True), None),
            (dcp_commit(2, disk=True), None),
            (dcp_abort(9, disk=True), None),
            (dcp_commit(9, disk=True), DurabilityMonitorError),
            (check(lambda m: m.num_pending), 1),
        ],
    ),
    # P8: one pending prepare per key
    Case(
        "P8 a second prepare for a key in memory",
        passive,
        [(receive(1), None), (receive(2, key=1), DurabilityMonitorError)],
    ),
    Case(
        "P8 a second prepare for a key in a disk snapshot replaces the first",
        passive,
        [
            (receive(1, L3, disk=True), None),
            (receive(2, key=1, disk=True), None),
            (check(lambda m: (m.num_pending, m.pending(k(1)).seqno)), (1, 2)),
            (snapshot_end(2, disk=True), NOTHING),
            (persisted(2), [SeqnoAck(2)]),
        ],
    ),
    Case(
        "P8 a seqno not above the last",
        passive,
        [(receive(2), None), (receive(1), DurabilityMonitorError)],
    ),
    # P9: promotion
    Case(
        "P9 the pending prepares become maybe visible on the new active",
        passive,
        [
            (receive(1), None),
            (receive(2, L3), None),
            (receive(3), None),
            (dcp_commit(1), None),
            (snapshot_end(3), [SeqnoAck(1)]),
            (
                lambda m: _promote_and_replicate(m),
                [NOTHING, NOTHING, NOTHING, [commit(2, client=False), commit(3, client=False)]],
            ),
        ],
    ),
    Case(
        "P9 a chain that cannot reach a majority keeps them pending and re-committing",
        passive,
        [
            (receive(1), None),
            (snapshot_end(1), [SeqnoAck(1)]),
            (check(lambda m: m.re_committing(k(1))), True),
            (lambda m: _promote_to_half_chain(m), [NOTHING, NOTHING, True, NOTHING]),
        ],
    ),
    Case(
        "P9 the replica's high prepared seqno is the new active's own ack",
        passive,
        [
            (receive(1, L3), None),
            (snapshot_end(1), NOTHING),
            (persisted(1), [SeqnoAck(1)]),
            (receive(2, L3), None),
            (snapshot_end(2), NOTHING),
            (
                check(
                    lambda m: (
                        (new := m.promote("a")).high_prepared_seqno,
                        new.persisted_seqno,
                        new.ack_of("a"),
                        new.re_committing(k(1)),
                    )
                ),
                (1, 1, 1, True),
            ),
        ],
    ),
    # P10: a replaced prepare is no longer pending, but still a fence (as a completed one)
    Case(
        "P10 a PersistToMajority prepare replaced in a disk snapshot still fences its snapshot",
        passive,
        [
            (receive(1, L3), None),
            (receive(2), None),
            (snapshot_end(2), NOTHING),
            (receive(3, key=1, disk=True), None),
            (check(lambda m: (m.num_pending, m.pending(k(1)).seqno)), (2, 3)),
            (snapshot_end(3, disk=True), NOTHING),
            (persisted(2), [SeqnoAck(2)]),
            (persisted(3), [SeqnoAck(3)]),
        ],
    ),
]


def _promote_and_replicate(m: PassiveDurabilityMonitor) -> list[list[Decision]]:
    new = m.promote("a")
    assert m.num_pending == 0
    assert new.num_pending == 2 and new.high_prepared_seqno == 1
    assert new.pending(k(2)).maybe_visible and new.pending(k(3)).maybe_visible
    return [
        new.set_topology(topology_from_chains([["a", "r1"]])),
        new.tick(1e9),
        new.seqno_ack("r1", 3),
        new.persisted(2),
    ]


def _promote_to_half_chain(m: PassiveDurabilityMonitor) -> list[object]:
    """Failover with one replica configured: the new chain is the new active and a null slot
    (durability impossible), until a rebalance gives it a replica."""
    new = m.promote("a")
    return [
        new.set_topology(topology_from_chains([["a", None]])),
        new.tick(1e9),
        new.re_committing(k(1)),
        new.set_topology(topology_from_chains([["a", "r2"]])),
    ]


def run(case: Case) -> None:
    monitor = case.make()
    for i, (event, expected) in enumerate(case.steps):
        if isinstance(expected, type) and issubclass(expected, BaseException):
            with pytest.raises(expected):
                event(monitor)
        else:
            assert event(monitor) == expected, f"step {i} of {case.name}"


@pytest.mark.parametrize("case", ACTIVE_CASES, ids=[c.name for c in ACTIVE_CASES])
def test_active(case: Case) -> None:
    run(case)


@pytest.mark.parametrize("case", PASSIVE_CASES, ids=[c.name for c in PASSIVE_CASES])
def test_passive(case: Case) -> None:
    run(case)


def test_every_case_of_the_docstring_tables_is_in_the_test_tables() -> None:
    documented = set(re.findall(r"^([AP]\d+) ", durability_monitor.__doc__ or "", re.M))
    tested = {c.name.split()[0] for c in ACTIVE_CASES + PASSIVE_CASES}
    assert documented == tested


# -- invariants over random histories -------------------------------------------------

TOPOLOGIES = [
    [["a"]],
    [["a", "b"]],
    [["a", "b", "c"]],
    [["a", None, "c"]],
    [["a", None]],  # impossible
    [["a", "b", "c", "d"]],  # impossible: three replicas
    [["a", "b", "c"], ["d", "b", "c"]],
    [["a", "b"], ["c", "a"]],
    [["a", "c"], ["d", "e"]],
    [["a", "e"], ["a", "b", "d"]],
]
REPLICAS = ["b", "c", "d", "e", "f"]
KEYS = [f"k{i}".encode() for i in range(12)]
levels = st.sampled_from(list(DurabilityLevel))

prepares = st.tuples(
    st.just("prepare"),
    levels,
    st.sampled_from([None, 100, 400, 1500]),
    st.sampled_from(KEYS),
    st.integers(1, 3),
)
# a replica of the current topology mostly (its index), sometimes any node
acks = st.tuples(st.just("ack"), st.integers(0, 11), st.integers(-3, 1))
active_ops = st.lists(
    # prepares and acks most often, so that many prepares commit; topology changes rarely
    st.one_of(
        prepares,
        prepares,
        acks,
        acks,
        acks,
        st.tuples(st.just("persist"), st.integers(-2, 1)),
        st.tuples(st.just("tick"), st.floats(0, 0.15)),
        st.tuples(st.just("topology"), st.integers(0, len(TOPOLOGIES) - 1)),
    ),
    min_size=10,
    max_size=100,
)


@dataclass
class ActiveModel:
    """What the monitor was told, kept the plain way: per prepare, the replicas that acked it
    while it was pending (and have not left the topology since)."""

    monitor: ActiveDurabilityMonitor
    now: float = 0.0
    persisted: int = 0
    last_seqno: int = 0
    topology: ReplicationTopology | None = None
    writes: dict[int, SyncWrite] = field(default_factory=dict)
    pending: list[int] = field(default_factory=list)
    acked_by: dict[int, set[str]] = field(default_factory=dict)
    ended: Counter[int] = field(default_factory=Counter)
    answered: Counter[object] = field(default_factory=Counter)
    cookies: dict[object, int] = field(default_factory=dict)
    doomed: set[int] = field(default_factory=set)  # past their deadline, or impossible
    hps: int = 0

    def active_acked(self, seqno: int) -> bool:
        # Only asked about the oldest pending prepare: no fence can be before it.
        return self.writes[seqno].level is DurabilityLevel.Majority or seqno <= self.persisted

    def has_acked(self, node: str, seqno: int) -> bool:
        return self.active_acked(seqno) if node == "a" else node in self.acked_by[seqno]

    def satisfied(self, seqno: int) -> bool:
        if self.topology is None:
            return False
        for chain in self.topology.chains:
            acks = sum(self.has_acked(node, seqno) for node in chain.nodes)
            if not self.has_acked(chain.active, seqno) or acks < chain.majority:
                return False
        return True

    def apply(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            if isinstance(decision, Commit):
                assert self.satisfied(decision.seqno), decision
                self.complete(decision.seqno, decision.key, decision.cookie)
            elif isinstance(decision, Abort):
                assert decision.seqno in self.doomed, "aborts only past the deadline or impossible"
                assert not self.satisfied(decision.seqno), "a satisfied prepare commits"
                write = self.writes[decision.seqno]
                assert decision.reason != REASON_TIMEOUT or self.now >= (write.deadline or 0)
                self.complete(decision.seqno, decision.key, decision.cookie)
            else:
                assert isinstance(decision, Ambiguous)
                assert self.cookies[decision.cookie] in self.pending
                assert self.cookies[decision.cookie] in self.doomed
                self.answered[decision.cookie] += 1
        assert all(count == 1 for count in self.answered.values())
        if self.pending:  # nothing left that could complete
            assert not self.satisfied(self.pending[0]) and self.pending[0] not in self.doomed
        for seqno in self.doomed.intersection(self.pending):  # their clients are answered
            cookie = self.writes[seqno].cookie
            assert cookie is None or self.answered[cookie] == 1
        assert self.monitor.high_prepared_seqno >= self.hps
        self.hps = self.monitor.high_prepared_seqno

    def complete(self, seqno: int, key: bytes, cookie: object | None) -> None:
        assert self.pending and seqno == self.pending[0], "completions in seqno order"
        assert key == self.writes[seqno].key
        self.pending.pop(0)
        self.ended[seqno] += 1
        if cookie is not None:
            assert self.cookies[cookie] == seqno
            self.answered[cookie] += 1

    def track(self, write: SyncWrite) -> None:
        self.writes[write.seqno] = write
        self.pending.append(write.seqno)
        self.acked_by[write.seqno] = set()
        self.last_seqno = write.seqno
        if write.cookie is not None:
            self.cookies[write.cookie] = write.seqno

    def run(self, op: tuple[object, ...]) -> None:
        kind, *args = op
        getattr(self, f"op_{kind}")(*args)

    def op_prepare(
        self, level: DurabilityLevel, timeout_ms: int | None, key: bytes, gap: int
    ) -> None:
        possible = self.topology is not None and self.topology.durability_possible
        assert self.monitor.durability_possible == possible
        if not possible or self.monitor.pending(key) is not None:
            return  # the engine answers DurabilityImpossible / SyncWriteInProgress
        seqno = self.last_seqno + gap
        cookie = f"c{seqno}"
        decisions = self.monitor.add_prepare(
            seqno, key, level, now=self.now, timeout_ms=timeout_ms, cookie=cookie
        )
        deadline = self.now + (30_000 if timeout_ms is None else timeout_ms) / 1000
        self.track(SyncWrite(seqno, key, level, deadline, cookie))
        self.apply(decisions)

    def op_ack(self, pick: int, offset: int) -> None:
        replicas = sorted(self.topology.nodes - {"a"}) if self.topology else []
        node = replicas[pick % len(replicas)] if replicas and pick < 9 else REPLICAS[pick % 5]
        seqno = max(0, self.last_seqno + offset)
        for pending in self.pending:
            if pending <= seqno:
                self.acked_by[pending].add(node)
        self.apply(self.monitor.seqno_ack(node, seqno))

    def op_persist(self, offset: int) -> None:
        self.persisted = max(self.persisted, self.last_seqno + offset)
        self.apply(self.monitor.persisted(self.last_seqno + offset))

    def op_tick(self, seconds: float) -> None:
        self.now += seconds
        self.doom(lambda deadline: self.now >= deadline)
        self.apply(self.monitor.tick(self.now))

    def doom(self, applies: Callable[[float], bool]) -> None:
        for seqno in self.pending:
            deadline = self.writes[seqno].deadline
            if deadline is not None and applies(deadline):
                self.doomed.add(seqno)

    def op_topology(self, index: int) -> None:
        new = topology_from_chains(TOPOLOGIES[index], this_node="a")
        if self.topology is not None:
            for seqno in self.pending:
                self.acked_by[seqno] -= self.topology.nodes - new.nodes
        self.topology = new
        if not new.durability_possible:
            self.doom(lambda deadline: True)
        self.apply(self.monitor.set_topology(new))


@settings(max_examples=300, deadline=None)
@given(st.lists(levels, max_size=3), st.integers(0, len(TOPOLOGIES) - 1), active_ops)
def test_the_active_commits_only_what_each_chain_acked_and_ends_every_prepare_once(
    maybe_visible: list[DurabilityLevel], first_topology: int, ops: list[tuple[object, ...]]
) -> None:
    inherited = [
        SyncWrite(i + 1, f"mv{i}".encode(), level) for i, level in enumerate(maybe_visible)
    ]
    model = ActiveModel(ActiveDurabilityMonitor("a", maybe_visible=inherited))
    for write in inherited:
        model.track(write)
    for op in [("topology", first_topology), *ops]:
        model.run(op)

    decisions, replica = model.monitor.step_down()
    for decision in decisions:  # the clients still waiting, answered ambiguous
        assert isinstance(decision, Ambiguous)
        assert model.cookies[decision.cookie] in model.pending
        model.answered[decision.cookie] += 1
    handed_over = {
        seqno
        for seqno in model.pending
        if (write := replica.pending(model.writes[seqno].key)) and write.seqno == seqno
    }
    assert handed_over == set(model.pending)
    for seqno in model.writes:  # every prepare ends exactly once
        assert model.ended[seqno] + (seqno in handed_over) == 1
    assert set(model.answered) == set(model.cookies)  # every client answered, once
    assert all(count == 1 for count in model.answered.values())
    assert model.monitor.num_pending == 0


# -- the replica --------------------------------------------------------------------------

replica_ops = st.lists(
    st.one_of(
        st.tuples(st.just("marker"), st.sampled_from([False, False, False, True])),
        st.tuples(st.just("prepare"), levels, st.sampled_from(KEYS)),
        st.tuples(st.just("mutation")),
        st.tuples(st.just("complete"), st.booleans()),
        st.tuples(st.just("persist"), st.floats(0, 1)),
    ),
    min_size=10,
    max_size=100,
)


@dataclass
class ReplicaModel:
    monitor: PassiveDurabilityMonitor = field(default_factory=PassiveDurabilityMonitor)
    seqno: int = 0
    persisted: int = 0
    disk: bool = False
    snapshot: int = 0  # index of the snapshot being received
    first_in_snapshot: int = 1
    ends: dict[int, int] = field(default_factory=dict)  # snapshot index -> its end
    disks: dict[int, bool] = field(default_factory=dict)
    # seqno -> level, snapshot index, key
    prepares: dict[int, tuple[DurabilityLevel, int, bytes]] = field(default_factory=dict)
    last_ack: int = 0

    def check_acks(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            assert isinstance(decision, SeqnoAck)
            assert decision.seqno > self.last_ack, "acks only rise"
            self.last_ack = decision.seqno
            assert decision.seqno <= max(self.ends.values(), default=0), "whole snapshots"
            for seqno, (level, snapshot, _) in self.prepares.items():
                if seqno > decision.seqno:
                    continue
                assert snapshot in self.ends, f"prepare {seqno} acked before its snapshot end"
                if level is DurabilityLevel.PersistToMajority or self.disks[snapshot]:
                    assert self.persisted >= self.ends[snapshot], f"{seqno} acked unpersisted"
        assert self.monitor.high_prepared_seqno == self.last_ack

    def end_snapshot(self) -> None:
        if self.seqno >= self.first_in_snapshot:  # the snapshot has items
            self.ends[self.snapshot] = self.seqno
            self.disks[self.snapshot] = self.disk
            self.check_acks(self.monitor.snapshot_end(self.seqno, disk=self.disk))
        self.snapshot += 1
        self.first_in_snapshot = self.seqno + 1

    def run(self, op: tuple[object, ...]) -> None:
        kind, *args = op
        getattr(self, f"op_{kind}")(*args)

    def op_marker(self, disk: bool) -> None:
        self.end_snapshot()
        self.disk = disk

    def op_prepare(self, level: DurabilityLevel, key: bytes) -> None:
        if self.monitor.pending(key) is not None and not self.disk:
            return  # the active never sends a second prepare for a key in memory
        self.seqno += 1
        self.prepares[self.seqno] = (level, self.snapshot, key)
        self.monitor.prepare(self.seqno, key, level, disk=self.disk)

    def op_mutation(self) -> None:
        self.seqno += 1

    def op_complete(self, commit: bool) -> None:
        """The active completes its oldest prepare still pending here."""
        pending = [s for s, (_, _, key) in self.prepares.items() if self.pending_at(key) == s]
        if not pending:
            return
        oldest = min(pending)
        self.seqno += 1
        complete = self.monitor.commit if commit else self.monitor.abort
        complete(oldest, self.prepares[oldest][2], disk=self.disk)

    def op_persist(self, fraction: float) -> None:
        self.persisted += int(fraction * (self.seqno - self.persisted))
        self.check_acks(self.monitor.persisted(self.persisted))

    def pending_at(self, key: bytes) -> int | None:
        write = self.monitor.pending(key)
        return None if write is None else write.seqno


@settings(max_examples=300, deadline=None)
@given(replica_ops)
@example(  # P10: k1's PersistToMajority prepare 2, replaced in a disk snapshot, fences 3
    [
        ("marker", False),
        ("mutation",),
        ("marker", False),
        ("marker", False),
        ("marker", False),
        ("marker", False),
        ("prepare", L3, b"k1"),
        ("prepare", L1, b"k0"),
        ("marker", True),
        ("prepare", L1, b"k1"),
    ]
)
def test_the_replica_acks_only_whole_satisfied_snapshots_and_in_the_end_everything(
    ops: list[tuple[object, ...]],
) -> None:
    model = ReplicaModel()
    for op in ops:
        model.run(op)
    model.end_snapshot()
    model.persisted = model.seqno
    model.check_acks(model.monitor.persisted(model.seqno))
    if model.prepares:
        assert model.monitor.high_prepared_seqno >= max(model.prepares)


def test_a_refusal_carries_the_status_the_engine_answers() -> None:
    """Each refusal is an engine error (a server answers its status as any other's); a plain
    one is still a ValueError, as the vbucket catches it."""
    monitor = ActiveDurabilityMonitor("a")
    with pytest.raises(DurabilityImpossible) as impossible:
        monitor.add_prepare(1, k(1), L1, now=0)
    monitor.set_topology(topology_from_chains([["a", "b"]]))
    monitor.add_prepare(1, k(1), L1, now=0)
    with pytest.raises(SyncWriteInProgress) as in_progress:
        monitor.add_prepare(2, k(1), L1, now=0)
    with pytest.raises(DurabilityMonitorError) as other:
        monitor.seqno_ack("a", 1)
    assert impossible.value.status == Status.DurabilityImpossible
    assert in_progress.value.status == Status.SyncWriteInProgress
    assert other.value.status == Status.Einval
    for refusal in (impossible.value, in_progress.value, other.value):
        assert isinstance(refusal, EngineError)
    assert isinstance(other.value, ValueError)

"""The durability monitor: every case of its docstring's tables (A1-A12, P1-P9), as a table.

A case builds a monitor, then runs steps: each is an event and what it must return (the
decisions, in order; ``None`` for an event that decides nothing; an exception class for a
refusal) or a check of the monitor's state. Prepare ``n`` has key ``kn`` and, on the active,
client cookie ``cn``. The active is node ``a``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from dcpkv.core.durability_monitor import (
    REASON_IMPOSSIBLE,
    REASON_TIMEOUT,
    Abort,
    ActiveDurabilityMonitor,
    Ambiguous,
    Commit,
    Decision,
    DurabilityMonitorError,
    Level,
    PassiveDurabilityMonitor,
    SeqnoAck,
    SyncWrite,
)
from dcpkv.core.replication_topology import TopologyError, topology_from_chains

Monitor = Any  # an ActiveDurabilityMonitor or a PassiveDurabilityMonitor, as the case says
Event = Callable[[Monitor], object]
L1, L2, L3 = Level.MAJORITY, Level.MAJORITY_AND_PERSIST_TO_ACTIVE, Level.PERSIST_TO_MAJORITY
NOTHING: list[Decision] = []


def k(n: int) -> bytes:
    return f"k{n}".encode()


def c(n: int) -> str:
    return f"c{n}"


# -- events -------------------------------------------------------------------------------


def prepare(n: int, level: Level = L1, *, timeout_ms: int | None = None, now: float = 0) -> Event:
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


def receive(n: int, level: Level = L1, *, key: int | None = None, disk: bool = False) -> Event:
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
    Case("A1 no topology yet", active(), [(prepare(1), DurabilityMonitorError)]),
    Case("A1 a replica slot empty", active(["a", None]), [(prepare(1), DurabilityMonitorError)]),
    Case(
        "A1 three replicas",
        active(["a", "r1", "r2", "r3"]),
        [(check(lambda m: m.durability_possible), False), (prepare(1), DurabilityMonitorError)],
    ),
    Case(
        "A1 a second chain without its majority",
        active(RS, ["b", None]),
        [(prepare(1), DurabilityMonitorError)],
    ),
    Case(
        "A1 a key with a pending prepare",
        active(RS),
        [
            (prepare(1), NOTHING),
            (lambda m: m.add_prepare(2, k(1), L1, now=0), DurabilityMonitorError),
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
            (snapshot_end(2), [SeqnoAck(2)]),
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
    import re

    from dcpkv.core import durability_monitor

    documented = set(re.findall(r"^([AP]\d+) ", durability_monitor.__doc__ or "", re.M))
    tested = {c.name.split()[0] for c in ACTIVE_CASES + PASSIVE_CASES}
    assert documented == tested

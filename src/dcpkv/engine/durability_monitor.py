"""The durability monitor of one vbucket: when a SyncWrite's prepare commits, aborts or is
acknowledged (PROTOCOL.md, "SyncWrites"; kv_engine's Active- and PassiveDurabilityMonitor).

Theory of operation
-------------------
A durable write becomes a *prepare* with its own seqno. The vbucket's active tracks it in an
:class:`ActiveDurabilityMonitor` until it can be committed, or must be aborted; each replica
tracks the prepares it receives in a :class:`PassiveDurabilityMonitor`, which says which seqno
to acknowledge to the active (DcpSeqnoAcknowledged) and when. Both are plain objects: the
engine tells them what happened (a prepare, an ack, a persistence, the time, a new topology)
and acts on the *decisions* they return, in order: :class:`Commit`, :class:`Abort`,
:class:`Ambiguous` (answer SyncWriteAmbiguous to a waiting client) and :class:`SeqnoAck`. They
own no socket, thread or clock: the time is passed in, in seconds.

**Acks.** A node's ack is its *high prepared seqno* (HPS): every prepare at or below it is
locally satisfied on that node. A replica's comes in seqno acknowledgements; the active's own is
computed here, walking its pending prepares in seqno order: a prepare at or below the persisted
seqno is passed, so is a Majority one; a MajorityAndPersistToActive or PersistToMajority one
that is not persisted yet is a *fence* that stops the walk (and everything after it) until the
engine reports its persistence. A replica acks a PersistToMajority prepare only once persisted,
so the active takes a replica's seqno as it comes, whatever the level.

**Commit rule.** A prepare is *satisfied* when, in the first chain and in the second if there
is one, at least ``majority`` named nodes acked it (null slots never ack) and the chain's active
is among them. Pending prepares complete strictly in seqno order: only the oldest one may
commit or abort. Since a node's ack covers every prepare below it, a later prepare is never
satisfied before an earlier one; a timeout is what breaks the order, and it waits its turn.
(The reference does not ask the first chain's active about a Majority prepare; that differs
only behind a fence, where it would commit out of order. The spec's rule is kept.)

Where the reference keeps the client of a later prepare past its deadline waiting until its
turn comes, this monitor answers it Ambiguous at its deadline (A4): the answer could be no
better in its turn, and the client asked not to wait longer.

Active side (events, then the decisions they return; "head" is the oldest pending prepare):

==== ===================================== ==================================================
case event and condition                   decisions
==== ===================================== ==================================================
A1   add_prepare, durability impossible    refused (DurabilityImpossible): the engine
     (no topology, or a chain without a    answers so before making the prepare, asking
     majority of named nodes, or more      ``durability_possible``; so is a key with a
     than 2 replicas)                      pending prepare (SyncWriteInProgress, asking
                                           ``pending``); a seqno not above the last or a
                                           timeout <= 0 (DurabilityMonitorError); level 0
                                           (no DurabilityLevel: ValueError)
A2   any event, the head is satisfied      Commit(seqno, key, cookie); then the next head
A3   tick(now), the head's deadline passed Abort(seqno, key, cookie, "timeout"); then the
     and it is not satisfied               next head (an aborted fence no longer stops the
                                           active's HPS)
A4   tick(now), a later prepare's deadline Ambiguous(cookie) now; the prepare waits its turn:
     passed                                Commit if satisfied by then, else Abort
A5   set_topology, durability impossible   every prepare with a timeout is doomed as by A3
                                           and A4, reason "durability impossible"
A6   set_topology                          nodes that left lose their acks; nodes kept keep
                                           them; then A2 for the new chains
A7   seqno_ack(node, seqno)                the node's ack rises to seqno (never beyond the
                                           last prepare: it cannot ack what it was never
                                           sent); a lower ack is ignored; then A2
A8   seqno_ack from a node in no chain     kept: it counts once a topology names the node
A9   seqno_ack naming this node            refused (DurabilityMonitorError): a misconfigured
                                           consumer_name
A10  persisted(seqno)                      the active's HPS passes fences up to seqno; A2
A11  step_down() (leaving active)          Ambiguous(cookie) for every pending prepare with
                                           a client; the prepares go to the returned
                                           PassiveDurabilityMonitor
A12  a *maybe visible* prepare (from       no deadline and no client: never times out, never
     promotion or warm-up)                 doomed; commits once satisfied (A2)
A13  re_committing(key)                    True while the key's pending prepare is maybe
                                           visible: a read of the key answers
                                           SyncWriteReCommitInProgress (the old active may
                                           have committed it); a client's own prepare hides
                                           nothing (readers see the committed value)
==== ===================================== ==================================================

Replica side: a snapshot's prepares are acknowledged only once the whole snapshot arrived
(``snapshot_end``), oldest snapshot first:

==== ===================================== ==================================================
case event and condition                   the replica's HPS and decisions
==== ===================================== ==================================================
P1   snapshot_end, memory snapshot not     passes the snapshot's prepares up to the first
     persisted yet                         PersistToMajority one; SeqnoAck(HPS) if it moved
P2   snapshot_end or persisted, the        passes every prepare of the snapshot; SeqnoAck
     snapshot is persisted                 if it moved
P3   disk snapshot not persisted           passes nothing (deduplication may have hidden a
                                           PersistToMajority prepare behind a lower one)
P4   disk snapshot persisted               HPS = the snapshot's end, prepares or not
P5   a snapshot not done (P1 stopped at a  later snapshots wait for it
     fence, or P3)
P6   commit / abort (memory snapshot)      must be the oldest pending prepare, key and seqno
                                           (else DurabilityMonitorError); it stays a fence
                                           until the HPS passes it
P7   commit / abort (disk snapshot)        matched by key; an abort with no prepare is
                                           ignored (deduplicated)
P8   prepare for a key already pending     refused in a memory snapshot; in a disk snapshot
                                           the newer replaces the older (deduplicated)
P9   promote(node)                         the pending prepares go to the returned
                                           ActiveDurabilityMonitor as maybe visible (A12),
                                           with the replica's HPS (its own first ack), HCS
                                           and persisted seqno; re_committing(key) is True
                                           for each of them, here and there (A13)
P10  a prepare replaced (P8) above the     no longer pending, but a fence until the HPS
     HPS                                   passes it, as a completed one (P6): a
                                           PersistToMajority one of an earlier memory
                                           snapshot holds later acks until that snapshot
                                           is persisted
==== ===================================== ==================================================
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dcpkv.core.replication_topology import ReplicationTopology, TopologyError
from dcpkv.engine.item import DurabilityImpossible, Einval, SyncWriteInProgress
from dcpkv.protocol.constants import DurabilityLevel

DEFAULT_TIMEOUT_MS = 30_000  # the reference's default; a bucket setting
REASON_TIMEOUT = "timeout"
REASON_IMPOSSIBLE = "durability impossible"


class DurabilityMonitorError(Einval, ValueError):
    """An event the monitor refuses (the message says why); nothing changed. The two
    refusals of a prepare a client can act on (A1) are the engine's own errors:
    :class:`DurabilityImpossible` (the topology cannot satisfy it) and
    :class:`SyncWriteInProgress` (its key has one pending)."""


@dataclass(slots=True, eq=False)
class SyncWrite:
    """A tracked prepare. ``deadline`` (seconds, on the caller's clock) is None for a maybe
    visible prepare; ``cookie`` is the waiting client, if any; ``doomed`` is why it must abort
    when its turn comes unless satisfied by then."""

    seqno: int
    key: bytes
    level: DurabilityLevel
    deadline: float | None = None
    cookie: object | None = None
    doomed: str | None = None

    @property
    def maybe_visible(self) -> bool:
        return self.deadline is None


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit the prepare at ``seqno``; answer ``cookie`` (if any) Success."""

    seqno: int
    key: bytes
    cookie: object | None = None


@dataclass(frozen=True, slots=True)
class Abort:
    """Abort the prepare at ``seqno``; answer ``cookie`` (if any) SyncWriteAmbiguous."""

    seqno: int
    key: bytes
    cookie: object | None
    reason: str


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """Answer ``cookie`` SyncWriteAmbiguous: its prepare's outcome is not known to it."""

    cookie: object


@dataclass(frozen=True, slots=True)
class SeqnoAck:
    """Send DcpSeqnoAcknowledged with this high prepared seqno to the active."""

    seqno: int


Decision = Commit | Abort | Ambiguous | SeqnoAck


def _as_maybe_visible(write: SyncWrite) -> SyncWrite:
    return SyncWrite(write.seqno, write.key, DurabilityLevel(write.level))


class ActiveDurabilityMonitor:
    """The active's side (the A cases of the module docstring)."""

    def __init__(
        self,
        node: str,
        *,
        default_timeout_ms: int = DEFAULT_TIMEOUT_MS,
        persisted_seqno: int = 0,
        high_prepared_seqno: int = 0,
        high_completed_seqno: int = 0,
        maybe_visible: Iterable[SyncWrite] = (),
    ) -> None:
        self.node = node
        self.default_timeout_ms = default_timeout_ms
        self.topology: ReplicationTopology | None = None
        self.persisted_seqno = persisted_seqno
        self.high_prepared_seqno = high_prepared_seqno
        self.high_completed_seqno = high_completed_seqno
        self._pending: deque[SyncWrite] = deque()
        # The pending prepares above the active's HPS, its fence first: a suffix of _pending.
        self._ahead: deque[SyncWrite] = deque()
        self._by_key: dict[bytes, SyncWrite] = {}
        self._acks: dict[str, int] = {}
        self._last_seqno = 0
        for write in maybe_visible:
            self._track(_as_maybe_visible(write))
        self._last_seqno = max(self._last_seqno, high_prepared_seqno, high_completed_seqno)
        self._advance_hps()

    # -- reading ------------------------------------------------------------------------

    @property
    def durability_possible(self) -> bool:
        return self.topology is not None and self.topology.durability_possible

    def pending(self, key: bytes) -> SyncWrite | None:
        """The key's pending prepare (a second write to it gets SyncWriteInProgress)."""
        return self._by_key.get(key)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def re_committing(self, key: bytes) -> bool:
        """Whether the key's pending prepare is maybe visible (A13)."""
        write = self._by_key.get(key)
        return write is not None and write.maybe_visible

    def ack_of(self, node: str) -> int:
        """The highest prepare ``node`` acknowledged (this node: its HPS)."""
        return self.high_prepared_seqno if node == self.node else self._acks.get(node, 0)

    # -- events -------------------------------------------------------------------------

    def add_prepare(
        self,
        seqno: int,
        key: bytes,
        level: DurabilityLevel,
        *,
        now: float,
        timeout_ms: int | None = None,
        cookie: object | None = None,
    ) -> list[Decision]:
        """Track a new prepare (A1); it may commit at once (a chain of the active alone)."""
        if not self.durability_possible:
            raise DurabilityImpossible(
                f"vbucket topology {self.topology} cannot satisfy a SyncWrite"
            )
        timeout = self.default_timeout_ms if timeout_ms is None else timeout_ms
        if timeout <= 0:
            raise DurabilityMonitorError(f"timeout must be > 0 ms, not {timeout}")
        self._track(SyncWrite(seqno, key, DurabilityLevel(level), now + timeout / 1000, cookie))
        self._advance_hps()
        return self._complete()

    def seqno_ack(self, node: str, seqno: int) -> list[Decision]:
        """A replica acknowledged its high prepared seqno (A7, A8, A9)."""
        if node == self.node:
            raise DurabilityMonitorError(f"seqno ack from {node!r}, the active's own name")
        acked = min(seqno, self._last_seqno)
        if acked > self._acks.get(node, 0):
            self._acks[node] = acked
        return self._complete()

    def persisted(self, seqno: int) -> list[Decision]:
        """The engine persisted everything up to ``seqno`` (A10)."""
        self.persisted_seqno = max(self.persisted_seqno, seqno)
        self._advance_hps()
        return self._complete()

    def set_topology(self, topology: ReplicationTopology) -> list[Decision]:
        """New chains from the manager (A5, A6): every pending prepare is judged again."""
        if topology.first.active != self.node:
            raise TopologyError(
                f"the first chain's active is {topology.first.active!r}, "
                f"but this node is {self.node!r}"
            )
        if self.topology is not None:
            for node in self.topology.nodes - topology.nodes:
                self._acks.pop(node, None)
        self.topology = topology
        if topology.durability_possible:
            return self._complete()
        return self._doom(REASON_IMPOSSIBLE, lambda deadline: True)

    def tick(self, now: float) -> list[Decision]:
        """Time passed: prepares past their deadline abort in turn (A3, A4)."""
        return self._doom(REASON_TIMEOUT, lambda deadline: now >= deadline)

    def step_down(self) -> tuple[list[Decision], PassiveDurabilityMonitor]:
        """The vbucket leaves the active state (A11); this monitor is empty afterwards."""
        decisions: list[Decision] = [
            Ambiguous(write.cookie) for write in self._pending if write.cookie is not None
        ]
        passive = PassiveDurabilityMonitor(
            persisted_seqno=self.persisted_seqno,
            high_prepared_seqno=self.high_prepared_seqno,
            high_completed_seqno=self.high_completed_seqno,
            prepares=self._pending,
        )
        self._pending.clear()
        self._ahead.clear()
        self._by_key.clear()
        return decisions, passive

    # -- the rules ----------------------------------------------------------------------

    def _track(self, write: SyncWrite) -> None:
        if write.seqno <= self._last_seqno:
            raise DurabilityMonitorError(
                f"prepare seqno {write.seqno} is not above the last one ({self._last_seqno})"
            )
        if write.key in self._by_key:
            raise SyncWriteInProgress(
                f"key {write.key!r} has a pending prepare at {self._by_key[write.key].seqno}"
            )
        self._pending.append(write)
        if write.seqno > self.high_prepared_seqno:
            self._ahead.append(write)
        self._by_key[write.key] = write
        self._last_seqno = write.seqno

    def _advance_hps(self) -> None:
        while self._ahead:
            write = self._ahead[0]
            if write.level is not DurabilityLevel.Majority and write.seqno > self.persisted_seqno:
                return  # a fence until persisted
            self.high_prepared_seqno = write.seqno
            self._ahead.popleft()

    def _satisfied(self, write: SyncWrite) -> bool:
        if self.topology is None:
            return False
        for chain in self.topology.chains:
            if self.ack_of(chain.active) < write.seqno:
                return False
            acks = sum(1 for node in chain.nodes if self.ack_of(node) >= write.seqno)
            if acks < chain.majority:
                return False
        return True

    def _complete(self) -> list[Decision]:
        """Complete the head while it is satisfied (A2) or doomed (A3)."""
        decisions: list[Decision] = []
        while self._pending:
            write = self._pending[0]
            if self._satisfied(write):
                decisions.append(Commit(write.seqno, write.key, write.cookie))
            elif write.doomed is not None:
                decisions.append(Abort(write.seqno, write.key, write.cookie, write.doomed))
            else:
                break
            self._pending.popleft()
            del self._by_key[write.key]
            # max: a maybe visible prepare may be below a completion seen out of order in a
            # disk snapshot
            self.high_completed_seqno = max(self.high_completed_seqno, write.seqno)
            if self._ahead and self._ahead[0] is write:
                self._ahead.popleft()  # an aborted fence
                self._advance_hps()
        return decisions

    def _doom(self, reason: str, applies: Callable[[float], bool]) -> list[Decision]:
        """Doom the prepares with a deadline that ``applies`` to; complete what can be;
        answer the doomed ones still waiting for their turn Ambiguous (A3, A4, A5)."""
        for write in self._pending:
            if write.deadline is not None and write.doomed is None and applies(write.deadline):
                write.doomed = reason
        decisions = self._complete()
        for write in self._pending:
            if write.doomed is not None and write.cookie is not None:
                decisions.append(Ambiguous(write.cookie))
                write.cookie = None
        return decisions


class PassiveDurabilityMonitor:
    """A replica's side (the P cases of the module docstring)."""

    def __init__(
        self,
        *,
        persisted_seqno: int = 0,
        high_prepared_seqno: int = 0,
        high_completed_seqno: int = 0,
        prepares: Iterable[SyncWrite] = (),
    ) -> None:
        self.persisted_seqno = persisted_seqno
        self.high_prepared_seqno = high_prepared_seqno
        self.high_completed_seqno = high_completed_seqno
        # Prepares not committed or aborted yet, oldest first, and by key.
        self._incomplete: deque[SyncWrite] = deque()
        self._by_key: dict[bytes, SyncWrite] = {}
        # Prepares above the HPS, pending or not (a completed or replaced one is still a fence).
        self._above_hps: deque[SyncWrite] = deque()
        self._snapshot_ends: deque[tuple[int, bool]] = deque()
        self._last_seqno = 0
        self._last_snapshot_end = 0  # of the snapshots this monitor was told about
        for write in prepares:
            self._track(_as_maybe_visible(write), disk=False)
        self._last_seqno = max(self._last_seqno, high_prepared_seqno, high_completed_seqno)

    def pending(self, key: bytes) -> SyncWrite | None:
        return self._by_key.get(key)

    @property
    def num_pending(self) -> int:
        return len(self._incomplete)

    def re_committing(self, key: bytes) -> bool:
        """Whether the key has a pending prepare: every one is maybe visible to a vbucket
        promoted before it got an active monitor (A13, P9)."""
        return key in self._by_key

    # -- events -------------------------------------------------------------------------

    def prepare(
        self, seqno: int, key: bytes, level: DurabilityLevel, *, disk: bool = False
    ) -> None:
        """A prepare arrived from the active (P8); ``disk``: inside a disk snapshot."""
        self._track(SyncWrite(seqno, key, DurabilityLevel(level)), disk=disk)

    def snapshot_end(self, seqno: int, *, disk: bool = False) -> list[Decision]:
        """The snapshot ending at ``seqno`` arrived whole (P1-P5)."""
        if seqno <= self._last_snapshot_end:
            raise DurabilityMonitorError(
                f"snapshot end {seqno} is not above the last one ({self._last_snapshot_end})"
            )
        self._last_snapshot_end = seqno
        self._snapshot_ends.append((seqno, disk))
        return self._update_hps()

    def persisted(self, seqno: int) -> list[Decision]:
        """The engine persisted everything up to ``seqno`` (P2, P4)."""
        self.persisted_seqno = max(self.persisted_seqno, seqno)
        return self._update_hps()

    def commit(self, prepared_seqno: int, key: bytes, *, disk: bool = False) -> None:
        """A DcpCommit for the prepare at ``prepared_seqno`` (P6, P7)."""
        self._complete(prepared_seqno, key, "commit", disk)

    def abort(self, prepared_seqno: int, key: bytes, *, disk: bool = False) -> None:
        """A DcpAbort for the prepare at ``prepared_seqno`` (P6, P7)."""
        self._complete(prepared_seqno, key, "abort", disk)

    def promote(
        self, node: str, *, default_timeout_ms: int = DEFAULT_TIMEOUT_MS
    ) -> ActiveDurabilityMonitor:
        """The vbucket becomes active on ``node`` (P9); this monitor is empty afterwards."""
        active = ActiveDurabilityMonitor(
            node,
            default_timeout_ms=default_timeout_ms,
            persisted_seqno=self.persisted_seqno,
            high_prepared_seqno=self.high_prepared_seqno,
            high_completed_seqno=self.high_completed_seqno,
            maybe_visible=self._incomplete,
        )
        self._incomplete.clear()
        self._by_key.clear()
        self._above_hps.clear()
        self._snapshot_ends.clear()
        return active

    # -- the rules ----------------------------------------------------------------------

    def _track(self, write: SyncWrite, *, disk: bool) -> None:
        if write.seqno <= self._last_seqno:
            raise DurabilityMonitorError(
                f"prepare seqno {write.seqno} is not above the last one ({self._last_seqno})"
            )
        older = self._by_key.get(write.key)
        if older is not None:
            if not disk:
                raise DurabilityMonitorError(
                    f"prepare {write.seqno} for key {write.key!r}, which has a pending "
                    f"prepare at {older.seqno}"
                )
            self._forget(older)  # P10: its completion was deduplicated away
        self._incomplete.append(write)
        self._by_key[write.key] = write
        if write.seqno > self.high_prepared_seqno:
            self._above_hps.append(write)
        self._last_seqno = write.seqno

    def _forget(self, write: SyncWrite) -> None:
        """``write`` is no longer pending (completed or replaced) but stays in _above_hps: a
        fence until the HPS passes it (P6, P10). Dropping a replaced PersistToMajority
        prepare from it would let the acks pass it before it is persisted."""
        self._incomplete.remove(write)
        del self._by_key[write.key]

    def _update_hps(self) -> list[Decision]:
        before = self.high_prepared_seqno
        while self._snapshot_ends and self._pass_snapshot(*self._snapshot_ends[0]):
            self._snapshot_ends.popleft()
        if self.high_prepared_seqno > before:
            return [SeqnoAck(self.high_prepared_seqno)]
        return []

    def _pass_snapshot(self, end: int, disk: bool) -> bool:
        """Move the HPS into the snapshot ending at ``end``; True when it is all passed."""
        persisted = self.persisted_seqno >= end
        if disk and not persisted:
            return False  # P3
        ceiling = (
            DurabilityLevel.PersistToMajority
            if persisted
            else DurabilityLevel.MajorityAndPersistToActive
        )
        above = self._above_hps
        while above and above[0].seqno <= end and above[0].level <= ceiling:
            self.high_prepared_seqno = above.popleft().seqno
        if disk:
            self.high_prepared_seqno = max(self.high_prepared_seqno, end)  # P4
        return not (above and above[0].seqno <= end)

    def _complete(self, seqno: int, key: bytes, what: str, disk: bool) -> None:
        write = self._by_key.get(key) if disk else self._oldest()
        if write is None and disk and what == "abort":
            return  # P7: its prepare was deduplicated away
        if write is None or write.key != key or write.seqno != seqno:
            expected = "none" if write is None else f"{write.key!r} at {write.seqno}"
            raise DurabilityMonitorError(
                f"{what} of {key!r} at {seqno}, but the pending prepare is {expected}"
            )
        self._forget(write)
        self.high_completed_seqno = max(self.high_completed_seqno, seqno)

    def _oldest(self) -> SyncWrite | None:
        return self._incomplete[0] if self._incomplete else None

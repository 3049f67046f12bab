"""One vbucket move of a rebalance, as a sans-I/O state machine (spec 002, "How ns_server
performs a partition rebalance").

Theory of operation
-------------------
A :class:`VBucketMove` takes one vbucket from its old chain ``[active, replicas..]`` to its new
one (chains by node name, ``None`` for nobody). The driver (:mod:`dcpkv.cluster.rebalance`)
reads what the nodes of both chains hold of the vbucket (a :class:`NodeView` each: state, high
and persisted seqno; ``None`` when the node did not answer), hands it to :meth:`VBucketMove.step`
with the time, and carries out the :class:`Action` list it gets back: a CAS-ordered SetVbucket,
a DelVbucket, or the map update for this vbucket (after which it calls :meth:`committed`). The
move never does I/O, so every path below is a table-driven test.

=========  =================================================  ==============================
phase      what it asks of the nodes                          leaves when
=========  =================================================  ==============================
build      every node of the new chain that held no copy      each has persisted up to the
           becomes a replica; it streams from the current     active's high seqno as seen
           active (the map does not change yet)               when the phase began -> ready
                                                              (active changes) or map
ready      nothing: the driver gathers the ready moves into   ``hand_over()`` -> takeover
           a handover group and tells their old and new
           actives the map naming the new ones (.handover)
takeover   the new active's copy goes pending; its node       the new copy is active and the
           streams with the TakeOver flag from the current    old one dead -> map
           active, which hands over (dead, then active)
map        the driver puts the new chain in the map, persists ``committed()`` -> clean
           it and pushes it (with its group's, at once):
           clients and replicas follow
clean      nothing, until every copy of the new chain holds   -> done, after a DelVbucket
           its state and has persisted up to the new active's for each node of the old chain
           high seqno as seen when the phase began            that is not in the new one
=========  =================================================  ==============================

A replica-only move (same active) skips takeover: the new replica is built before the old one is
dropped. A new active that was a replica of the vbucket already has its data: build finds it
caught up and the takeover stream sends only the tail.

Faults (spec step 5): build and clean fail when no copy made progress for ``stall_s``; takeover
when it outlasts ``takeover_s``; the driver abandons a move whose node stops answering
(:meth:`VBucketMove.abandon`) and reverts the running ones when the rebalance is stopped
(:meth:`VBucketMove.stop`); a ready move is reverted like a building one. A move that fails
before the map changed is *reverted*: first the new copies go (built ones dead, a promoted
replica back to replica), so a pending copy refuses the handoff's last step; then the old
active is set active again if the handoff had made it dead (a vbucket going active cuts a new
failover entry, which rolls nobody back as nothing was written past it). The map never named
the new copies; a later rebalance reuses their data. An old active that cannot be reached
stays as it is: the operator (or automatic failover) fails its node over. A move whose map is
committed cannot be reverted; a failed clean leaves the old copies to the next run. Until a
move ends, the driver's sync leaves its vbucket alone on every node of both chains: the move
drives them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dcpkv.core.vbucket import VBucketState

STALL_S = 60.0  # build/clean: no copy advanced for this long
TAKEOVER_S = 30.0  # the handoff: pending to active


class Phase(enum.Enum):
    BUILD = "build"
    READY = "ready"
    TAKEOVER = "takeover"
    MAP = "map"
    CLEAN = "clean"
    DONE = "done"
    REVERTED = "reverted"


@dataclass(frozen=True, slots=True)
class NodeView:
    """What a node holds of the moving vbucket (state None: it holds none)."""

    state: VBucketState | None
    high: int = 0
    persisted: int = 0


@dataclass(frozen=True, slots=True)
class SetState:
    node: str
    vbucket: int
    state: VBucketState


@dataclass(frozen=True, slots=True)
class Delete:
    node: str
    vbucket: int


@dataclass(frozen=True, slots=True)
class CommitChain:
    vbucket: int


Action = SetState | Delete | CommitChain
_BEFORE_MAP = (Phase.BUILD, Phase.READY, Phase.TAKEOVER)  # a revert puts the old active back
Chain = tuple[str | None, ...]
Views = dict[str, NodeView | None]


@dataclass
class VBucketMove:
    vbucket: int
    old: Chain
    new: Chain
    now: float
    stall_s: float = STALL_S
    takeover_s: float = TAKEOVER_S
    phase: Phase = Phase.BUILD
    error: str | None = None
    target: int | None = None  # the seqno the current phase waits for copies to persist
    since: float = field(init=False)  # when the phase began
    progress_at: float = field(init=False)  # when a copy last advanced
    _seen: int = 0  # sum of the copies' high seqnos, to notice progress
    start_highs: dict[str, int] = field(default_factory=dict)  # new copies: high at start
    transferred_seen: int = 0  # the driver's last reading of ``transferred``

    def __post_init__(self) -> None:
        self.since = self.progress_at = self.now

    @property
    def old_active(self) -> str | None:
        return self.old[0]

    @property
    def new_active(self) -> str:
        active = self.new[0]
        assert active is not None, "a target chain always has an active"
        return active

    @property
    def builders(self) -> list[str]:
        """The nodes of the new chain that held no copy in the old one."""
        return [n for n in self.new if n is not None and n not in self.old]

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.DONE, Phase.REVERTED)

    def nodes(self) -> set[str]:
        """The nodes whose copy the move drives now (the driver's sync leaves it alone):
        every node of both chains until the map changes, then the old copies to delete."""
        if self.finished:
            return set()
        if self.phase is Phase.CLEAN:
            return {n for n in self.old if n is not None and n not in self.new}
        return {n for n in (*self.old, *self.new) if n is not None}

    def transferred(self, views: Views) -> int:
        """Items the new copies received so far (for progress)."""
        total = 0
        for node in self.builders:
            view = views.get(node)
            if view is not None:  # first seen holding nothing: everything it gets is copied
                start = self.start_highs.setdefault(node, view.high)
                total += max(0, view.high - start)
        return total

    # -- the machine ---------------------------------------------------------------------------

    def step(self, views: Views, now: float) -> list[Action]:
        """The actions to carry out now, given what the nodes hold (module docstring)."""
        self._note_progress(views, now)
        if self.phase is Phase.BUILD:
            return self._build(views, now)
        if self.phase is Phase.TAKEOVER:
            return self._takeover(views, now)
        if self.phase is Phase.MAP:
            return [CommitChain(self.vbucket)]
        if self.phase is Phase.CLEAN:
            return self._clean(views, now)
        return []

    def committed(self, now: float) -> None:
        """The driver persisted and pushed the map with the new chain."""
        if self.phase is Phase.MAP:
            self._enter(Phase.CLEAN, now)

    def _enter(self, phase: Phase, now: float) -> None:
        self.phase, self.since, self.progress_at, self.target = phase, now, now, None

    def _note_progress(self, views: Views, now: float) -> None:
        seen = sum(v.high + v.persisted for v in views.values() if v is not None)
        if seen != self._seen:
            self._seen, self.progress_at = seen, now

    def _build(self, views: Views, now: float) -> list[Action]:
        source = views.get(self.old_active) if self.old_active else None
        if self.old_active is None:
            self._enter(Phase.MAP, now)  # nothing to copy from: the new active starts empty
            return self.step(views, now)
        if source is None or source.state is not VBucketState.ACTIVE:
            why = f"the active {self.old_active} does not answer as active"
            return self._stalled(views, now, why)
        if self.target is None:
            self.target = source.high
        actions: list[Action] = []
        ready = True
        for node in self.builders:
            view = views.get(node)
            if view is None:
                ready = False
                continue
            if view.state is not VBucketState.REPLICA:
                actions.append(SetState(node, self.vbucket, VBucketState.REPLICA))
                ready = False
            elif view.persisted < self.target:
                ready = False
        if actions or not ready:
            return actions or self._stalled(views, now, "the new copies stopped catching up")
        if self.new_active != self.old_active:
            self._enter(Phase.READY, now)  # the driver hands it over with its group
            return []
        self._enter(Phase.MAP, now)
        return self.step(views, now)

    def hand_over(self, now: float) -> list[Action]:
        """The driver staged the map naming the new active (module docstring): the takeover
        begins, the new copy going pending."""
        assert self.phase is Phase.READY, self.phase
        self._enter(Phase.TAKEOVER, now)
        return [SetState(self.new_active, self.vbucket, VBucketState.PENDING)]

    def _stalled(self, views: Views, now: float, why: str) -> list[Action]:
        if now - self.progress_at < self.stall_s:
            return []
        return self._revert(views, why)

    def _takeover(self, views: Views, now: float) -> list[Action]:
        new, old = views.get(self.new_active), views.get(self.old_active or "")
        handed_over = old is None or old.state is not VBucketState.ACTIVE
        if new is not None and new.state is VBucketState.ACTIVE and handed_over:
            self._enter(Phase.MAP, now)
            return [CommitChain(self.vbucket)]
        if now - self.since >= self.takeover_s:
            return self._revert(views, f"the handoff to {self.new_active} timed out")
        if new is not None and new.state in (VBucketState.REPLICA, VBucketState.DEAD):
            return [SetState(self.new_active, self.vbucket, VBucketState.PENDING)]
        return []

    def abandon(self, views: Views, why: str) -> list[Action]:
        """A node of the move is down: revert before the map changed, else end keeping the
        old copies (the map already names the new ones)."""
        if self.phase in _BEFORE_MAP:
            return self._revert(views, why)
        if self.phase is Phase.CLEAN:
            self.phase, self.error = Phase.DONE, f"{why}; old copies kept"
        return []

    def stop(self, views: Views) -> list[Action]:
        """The rebalance is stopped: a move whose map is not committed is reverted."""
        if self.phase in _BEFORE_MAP:
            return self._revert(views, "the rebalance was stopped")
        return []

    def _revert(self, views: Views, why: str) -> list[Action]:
        """Put the old active back (module docstring); the move ends REVERTED. The new
        copies go first: a pending copy that is no longer pending refuses the handoff's last
        step, so the old active is never made active again beside a new one."""
        self.phase, self.error = Phase.REVERTED, why
        wanted = {n: VBucketState.DEAD for n in self.builders}
        if self.new_active != self.old_active and self.new_active not in self.builders:
            wanted[self.new_active] = VBucketState.REPLICA  # a promoted replica goes back
        if self.old_active is not None:
            wanted[self.old_active] = VBucketState.ACTIVE
        # an unreachable node or one holding no copy is left to the next sync
        return [
            SetState(node, self.vbucket, state)
            for node, state in wanted.items()
            if (view := views.get(node)) is not None and view.state not in (state, None)
        ]

    def _clean(self, views: Views, now: float) -> list[Action]:
        active = views.get(self.new_active)
        if active is None or active.state is not VBucketState.ACTIVE:
            return self._clean_stalled(now)
        if self.target is None:
            self.target = active.high
        actions: list[Action] = []
        ready = True
        for i, node in enumerate(self.new):
            view = views.get(node) if node is not None else None
            if node is None or view is None:
                ready = ready and node is None
                continue
            wanted = VBucketState.ACTIVE if i == 0 else VBucketState.REPLICA
            if view.state is not wanted:  # e.g. the old active staying on as a replica
                actions.append(SetState(node, self.vbucket, wanted))
            ready = ready and view.state is wanted and view.persisted >= self.target
        if not ready:
            return actions or self._clean_stalled(now)
        self.phase = Phase.DONE
        gone = [n for n in self.old if n is not None and n not in self.new]
        return [Delete(node, self.vbucket) for node in gone]

    def _clean_stalled(self, now: float) -> list[Action]:
        if now - self.progress_at >= self.stall_s:
            self.phase = Phase.DONE  # the map stands; the old copies are left to the next run
            self.error = "the new copies did not persist in time; old copies kept"
        return []

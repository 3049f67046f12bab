"""A handover group: vbuckets of a rebalance whose actives change hands together, and the map
that names their new actives. Sans-I/O; :mod:`.rebalance` drives it.

Theory of operation
-------------------
A client must never be left holding a map that names a copy which no longer takes writes. So
the map that names a vbucket's new active is decided *before* its handover, and the two nodes
that hand it over are told:

1. the moves whose new copies are built (:class:`~.vbucket_move.Phase` ``ready``) form a
   group; its *staged* map is the current map with all their new chains, one rev up
   (:meth:`Handover.of`, :meth:`Handover.staged`);
2. the group is persisted in the rebalance record (a manager that dies now finishes it on
   restart), then the staged map is pushed to each move's old active, served from the moment
   its copy goes dead, and new active, served from the moment it is active
   (:meth:`Handover.instructions`; the node side is :mod:`dcpkv.server.handover`). Only then
   do the new copies go pending and the takeovers run;
3. the manager watches the takeovers; whenever some have ended (handed over, or reverted),
   :meth:`Handover.ended` gives the map to commit at once and the group of the others: the
   staged map itself when the last of the group handed over (so the map the old and new
   actives already serve is the one every node gets); else the current map with the moves
   just handed over, one rev above the staged map (it must replace the staged map wherever a
   node adopted it: a reverted move's old active did when its copy went dead for a while, and
   a node that adopted it early names the others' pending copies), and the others staged
   again one rev above that. Each node is pushed, in that order on its one link, the others'
   staged map if it is one of their old or new actives, then the map (a node never holds the
   committed map without a staged one for the handovers still to come); every node at once,
   one push for what ended together, while the new record and map are written (not before:
   under load that write alone took up to 0.1 s). A manager that dies meanwhile may have
   pushed maps up to the record's rev + 2 that no file knows of: restarted, it ends the group
   from the map as written, its rev lifted above those (:meth:`Handover.lifted`).

One group at a time, and no other map change while it runs (the driver holds the manager's
lock throughout): every rev names one map. Two groups staged side by side would give two
different maps one rev, and a client keeps the first of them it sees.

A group's staged map names all its new actives, so the first of its vbuckets to change hands
makes its old active serve a map that names the others' new copies while they are still
pending: clients meet NotMyVbucket there (and retry) until those hand over too, or until the
next commit names their old actives again. The group's takeovers run side by side, so this
lasts about as long as the spread of their ends.

=====================  ====================================  ==============================
ended now              others still running                  commit; the group left
=====================  ====================================  ==============================
all, handed over       none                                  the staged map (rev r); none
some, or a revert      any                                   current + handed over, r+1;
                                                             the others staged at r+2
=====================  ====================================  ==============================
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from dcpkv.cluster.rebalance_plan import NamedChain, with_named_chains
from dcpkv.cluster.vbucket_map import VBucketMap
from dcpkv.core.vbucket import VBucketState

Move = tuple[int, NamedChain, NamedChain]  # (vbucket, old chain, new chain)


@dataclass(frozen=True, slots=True)
class Handover:
    """One group (module docstring): its bucket, its moves and the staged map's rev."""

    bucket: str
    moves: tuple[Move, ...]
    rev: int

    @classmethod
    def of(cls, bucket: str, current: VBucketMap, moves: Collection[Move]) -> Handover:
        return cls(bucket, tuple(sorted(moves)), current.rev + 1)

    @property
    def vbuckets(self) -> list[int]:
        return [vb for vb, _, _ in self.moves]

    def staged(self, current: VBucketMap) -> VBucketMap:
        """The map naming every new chain of the group, at the group's rev."""
        return replace(with_named_chains(current, self._chains(self.vbuckets)), rev=self.rev)

    def instructions(self) -> dict[str, dict[int, VBucketState]]:
        """node -> vbucket -> the state change that makes the staged map its own: the old
        active's copy going dead, the new active's becoming active."""
        out: dict[str, dict[int, VBucketState]] = {}
        for vb, old, new in self.moves:
            if old[0] is not None:
                out.setdefault(old[0], {})[vb] = VBucketState.DEAD
            if new[0] is not None:
                out.setdefault(new[0], {})[vb] = VBucketState.ACTIVE
        return out

    def ended(
        self, current: VBucketMap, done: Collection[int], failed: Collection[int]
    ) -> tuple[VBucketMap, Handover | None]:
        """Some of the moves ended, ``done`` handed over and ``failed`` reverted: the map to
        commit now and the group of the others (None: none left), module docstring's table."""
        others = [m for m in self.moves if m[0] not in done and m[0] not in failed]
        committed = with_named_chains(current, self._chains(done))
        if not others and not failed and current.rev == self.rev - 1:
            return replace(committed, rev=self.rev), None  # the staged map, byte for byte
        committed = replace(committed, rev=max(current.rev, self.rev) + 1)
        rest = Handover(self.bucket, tuple(others), committed.rev + 1) if others else None
        return committed, rest

    def lifted(self, current: VBucketMap) -> VBucketMap:
        """The current map with its rev lifted above any map of the group a manager that died
        may have pushed without writing it (a step's commit, then the others' staged map:
        the record's rev + 2), for a restarted manager to end the group from."""
        return replace(current, rev=max(current.rev, self.rev + 2))

    def _chains(self, vbuckets: Collection[int]) -> dict[int, NamedChain]:
        return {vb: new for vb, _, new in self.moves if vb in vbuckets}

    # -- the rebalance record ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "rev": self.rev,
            "moves": [[vb, list(old), list(new)] for vb, old, new in self.moves],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Handover:
        moves = tuple((int(vb), tuple(old), tuple(new)) for vb, old, new in doc["moves"])
        return cls(str(doc["bucket"]), moves, int(doc["rev"]))

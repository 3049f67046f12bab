"""A node's side of a vbucket handover: the map it is told beforehand and serves from the moment
the vbucket changes hands, and when that happened. Sans-I/O: the server state feeds it.

Theory of operation
-------------------
Before a rebalance hands a group of vbuckets over (:mod:`dcpkv.cluster.handover`), the manager
pushes the old and the new active of each a *staged* map: the map naming the new actives, the
one it pushes to every node once the handovers are done, with ``dcpkv.adoptWhen`` saying, per
vbucket, which state change makes it this node's map: ``dead`` on the old active (it just gave
the vbucket away), ``active`` on the new one (it just took it over). :func:`parse_push` tells a
staged push from an ordinary one and strips that section (clients never see it).

:class:`Handovers` (one per bucket) keeps the staged maps and is told of every state change:
:meth:`Handovers.state_changed` answers the staged map to serve from now on, if that change is
one it waits for. So the old active's first NotMyVbucket for a vbucket it gave away already
carries a map naming the new active, and the new active serves that map (GetClusterConfig,
NotMyVbucket answers, ClustermapChangeNotification pushes) from the moment it is active.

A staged map is *served* only. Replication keeps following the map the manager pushed for good:
a staged map also names the new actives of vbuckets still being handed over, and a pending copy
must keep streaming from its current active. A staged map whose moment never comes (a reverted
handover) is dropped once the served map is as new (so is one that lost to a newer map): the
manager always pushes one at least as new when a group of handovers ends.

========================  ==========================================  =====================
state change of vb        staged map waiting on it                    result
========================  ==========================================  =====================
any -> ``when[vb]``       newer than the map served                   served from now on
any -> ``when[vb]``       not newer (a newer map came meanwhile)      nothing
any other                 --                                          nothing
========================  ==========================================  =====================

What happened when, on the monotonic clock (``time.monotonic``, one clock for every process of a
host), for ``stat handover``: when each vbucket's copy last went dead here (from then on this node
answers NotMyVbucket for it), and when the map this node serves last named a new active for it.
``bench/rebalance.py`` reads both on every node to measure how long a moved vbucket's clients can
meet a map that does not name its new home.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from dcpkv.core.vbucket import VBucketState
from dcpkv.server.cluster_map import PushedConfig

ADOPT_WHEN = "adoptWhen"  # the key of the pushed config's dcpkv section


@dataclass(frozen=True, slots=True)
class StagedMap:
    config: PushedConfig
    when: dict[int, VBucketState]  # vbucket -> the state change that makes it current


def parse_push(raw: bytes) -> tuple[PushedConfig, dict[int, VBucketState] | None]:
    """A pushed config, and its ``adoptWhen`` section (None: an ordinary push), stripped from
    the bytes kept. ValueError when it is not a config or the section is malformed."""
    config = PushedConfig.parse(raw)
    if ADOPT_WHEN.encode() not in raw:  # the common case: no second parse
        return config, None
    doc = json.loads(raw)
    section = doc.get("dcpkv")
    if not isinstance(section, dict) or ADOPT_WHEN not in section:
        return config, None
    when = _adopt_when(section.pop(ADOPT_WHEN))
    stripped = json.dumps(doc, separators=(",", ":")).encode()
    return PushedConfig(stripped, config.version, config.this_node), when


def _adopt_when(section: object) -> dict[int, VBucketState]:
    if not isinstance(section, dict) or not section:
        raise ValueError(f"{ADOPT_WHEN} must map vbuckets to a state")
    when: dict[int, VBucketState] = {}
    for vb, state in section.items():
        if not str(vb).isdigit() or state not in ("active", "dead"):
            raise ValueError(f"{ADOPT_WHEN}: {vb!r}: {state!r} is not a vbucket and active|dead")
        when[int(vb)] = VBucketState.of(state)
    return when


def actives(raw: bytes) -> list[str | None]:
    """The server named active for each vbucket by a config (None: nobody)."""
    server_map = json.loads(raw).get("vBucketServerMap", {})
    servers, chains = server_map.get("serverList", []), server_map.get("vBucketMap", [])
    return [servers[c[0]] if c and 0 <= c[0] < len(servers) else None for c in chains]


@dataclass
class Handovers:
    """The staged maps of one bucket, and when its vbuckets changed hands (module docstring)."""

    staged: list[StagedMap] = field(default_factory=list)
    dead_at: dict[int, float] = field(default_factory=dict)  # vb -> its copy last went dead
    named_at: dict[int, float] = field(default_factory=dict)  # vb -> a new active served
    _states: dict[int, VBucketState | None] = field(default_factory=dict)
    _actives: list[str | None] = field(default_factory=list)  # of the map served

    def stage(self, staged: StagedMap) -> None:
        self.staged.append(staged)

    def state_changed(
        self, vb: int, state: VBucketState | None, served: PushedConfig | None, now: float
    ) -> PushedConfig | None:
        """A vbucket's state changed (None: deleted): the staged map to serve now, if any."""
        before, self._states[vb] = self._states.get(vb), state
        if state is VBucketState.DEAD and before is not VBucketState.DEAD:
            self.dead_at[vb] = now
        if state is None or state is before:
            return None
        ready = [s for s in self.staged if s.when.get(vb) is state]
        if not ready:
            return None
        newest = max(ready, key=lambda s: s.config.version).config
        return newest if served is None or newest.version > served.version else None

    def serving(self, config: PushedConfig, now: float) -> None:
        """The node serves ``config`` from now on: staged maps no newer go; the vbuckets
        whose active it names anew are noted."""
        self.staged = [s for s in self.staged if s.config.version > config.version]
        named = actives(config.raw)
        for vb, server in enumerate(named):
            if vb >= len(self._actives) or self._actives[vb] != server:
                self.named_at[vb] = now
        self._actives = named

    def stats(self) -> Iterator[tuple[str, object]]:
        yield "staged_maps", len(self.staged)
        for vb in sorted(self.dead_at.keys() | self.named_at.keys()):
            if vb in self.dead_at:
                yield f"vb_{vb}:dead_at", f"{self.dead_at[vb]:.6f}"
            if vb in self.named_at:
                yield f"vb_{vb}:new_active_served_at", f"{self.named_at[vb]:.6f}"

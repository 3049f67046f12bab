"""``dcpkv demo --chaos``: a node of the local cluster dies every so often, and comes back.

Theory of operation
-------------------
A thread runs *rounds*, one every ``every`` seconds (drawn uniformly from the range, so the
kills do not line up with the pipelines' triggers). A round is the life of one crash as an
operator sees it:

====================  ====================================================================
step                  what happens (each step is an :class:`Event`, timestamped)
====================  ====================================================================
``kill``              a random running data node gets SIGKILL (no final flush)
``failover``          the manager's auto-failover (switched on, with ``failover_timeout_s``)
                      notices the silent node and promotes its replicas: the round polls the
                      manager's status until the node's membership is ``failed``
``held``              not failed over in ``wait_s`` (the manager held it: see ``cluster
                      status``): the node is restarted and the round ends
``restart``           the node is started again on its port, with its data
``recovered``         delta recovery (``cluster recover --delta``): its vbuckets become
                      replicas of the current actives, roll back where the failover cut their
                      history, copy what changed since; the rebalance runs to its end and the
                      auto-failover count is reset (the manager allows one at a time)
``error``             the manager refused or did not answer: said, and the next round tries
                      (a round waits while a rebalance runs: one fault at a time)
====================  ====================================================================

A round is never cut short by :meth:`Chaos.stop`: it stops *between* rounds, so the job's
final catch-up and end check run on a whole cluster (every node back, every vbucket with its
replica). The thread then idles instead of ending, and it must: a node it restarted asked
the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), and Linux means the
parent *thread*, so an ending chaos thread would take every node it restarted down with it.
It is a daemon: it goes with the process.

The events feed the live line (:meth:`Chaos.summary`) and the report, which draws a vertical
line at each failover.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dcpkv.cluster.admin_client import AdminError, admin_request
from dcpkv.cluster.local import Child, LocalCluster
from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER

POLL_S = 0.2


@dataclass(frozen=True)
class ChaosSettings:
    every: tuple[float, float] = (20.0, 40.0)  # seconds between two kills, drawn uniformly
    failover_timeout_s: int = 5  # the manager's auto-failover timeout (1-3600)
    wait_s: float = 60.0  # longest wait for a failover or a restart
    rebalance_wait_s: float = 600.0  # a delta recovery of 1024 vbuckets takes a minute here
    seed: int | None = None


def parse_every(text: str) -> tuple[float, float]:
    """``"20-40"`` or ``"30"`` (seconds) as a (low, high) range; ValueError when malformed."""
    low, _, high = text.partition("-")
    pair = (float(low), float(high or low))
    if not 0 < pair[0] <= pair[1]:
        raise ValueError(f"{text!r}: want seconds as A or A-B with 0 < A <= B")
    return pair


@dataclass(frozen=True)
class Event:
    at: float  # Unix time
    kind: str  # kill, failover, held, restart, recovered, error
    node: str
    detail: str = ""

    def line(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.at))
        node = f" {self.node}" if self.node else ""
        return f"{when} {self.kind}{node}" + (f": {self.detail}" if self.detail else "")


@dataclass
class _Counts:
    kills: int = 0
    failovers: int = 0
    recovered: int = 0
    now: str = ""  # what the running round waits for
    events: list[Event] = field(default_factory=list)


class Chaos(threading.Thread):
    """Kills, waits for the failover, restarts and recovers nodes of ``cluster``."""

    def __init__(
        self, cluster: LocalCluster, settings: ChaosSettings,
        on_event: Callable[[Event], None] = lambda e: None,
    ) -> None:  # fmt: skip
        super().__init__(name="dcpkv-chaos", daemon=True)
        self.cluster = cluster
        self.settings = settings
        self.on_event = on_event
        self.rng = random.Random(settings.seed)
        self._counts = _Counts()
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._idle = threading.Event()  # the rounds are over

    # -- the manager ----------------------------------------------------------------------

    def admin(self, method: str, path: str, **params: str) -> dict[str, Any]:
        return admin_request(
            self.cluster.manager_url, method, path, user=DEFAULT_USER,
            password=DEFAULT_PASSWORD, params=params,
        )  # fmt: skip

    def switch_on(self) -> None:
        """Auto-failover on, with the round's timeout (the demo's cluster has it off)."""
        timeout = str(self.settings.failover_timeout_s)
        self.admin("POST", "/settings/autoFailover", enabled="true", timeout=timeout)

    def membership(self, address: str) -> str | None:
        """The node's membership (active, failed, ...), None while the manager is away."""
        try:
            doc = self.admin("GET", "/pools/default")
        except AdminError:
            return None
        return next(
            (n["clusterMembership"] for n in doc["nodes"] if n["hostname"] == address), None
        )

    # -- the rounds -------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._rounds()
        finally:
            self._idle.set()
        threading.Event().wait()  # never return: see the module docstring (PDEATHSIG)

    def _rounds(self) -> None:
        while not self._stop_event.wait(self.rng.uniform(*self.settings.every)):
            running = [c for c in self.cluster.data_nodes if c.running]
            if len(running) < 2 or self.rebalancing():
                continue  # one fault at a time: the last round's rebalance still runs
            try:
                self.round(self.rng.choice(running))
            except (AdminError, OSError, RuntimeError) as exc:
                self._note("error", "", str(exc))
            finally:
                self._set_now("")

    def round(self, child: Child) -> None:
        address = self.cluster.address(child)
        child.kill9()
        self._note("kill", address)
        self._set_now(f"{address} down, waiting for the failover")
        if not self._wait(lambda: self.membership(address) == "failed"):
            self._note("held", address, "not failed over in time; restarting it")
            child.restart(time.monotonic() + self.settings.wait_s)
            self._note("restart", address)
            return
        self._note("failover", address)
        self._set_now(f"{address} failed over, restarting it")
        child.restart(time.monotonic() + self.settings.wait_s)
        self._note("restart", address)
        self._set_now(f"{address} back, delta recovery")
        self.recover(address)

    def recover(self, address: str) -> None:
        self.admin("POST", "/controller/setRecoveryType", otpNode=address, recoveryType="delta")
        self.admin("POST", "/controller/rebalance")
        state = "running"
        deadline = time.monotonic() + self.settings.rebalance_wait_s
        while state == "running" and time.monotonic() < deadline:
            time.sleep(POLL_S)
            state = self.admin("GET", "/pools/default/rebalanceProgress")["state"]
        self.admin("POST", "/settings/autoFailover/resetCount")
        if state != "idle":
            raise RuntimeError(f"the recovery rebalance of {address} ended {state}")
        self._note("recovered", address)

    def rebalancing(self) -> bool:
        try:
            return self.admin("GET", "/pools/default/rebalanceProgress")["state"] == "running"
        except AdminError:
            return True  # the manager is away: not the moment for another fault

    def _wait(self, condition: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + self.settings.wait_s
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(POLL_S)
        return False

    def heal(self) -> None:
        """After :meth:`stop`: every node running and none failed over (a round that ended in
        an error may have left one behind, or a rebalance still running), so the job ends
        on a whole cluster."""
        deadline = time.monotonic() + self.settings.rebalance_wait_s
        while self.rebalancing() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        for child in self.cluster.data_nodes:
            if not child.running:
                child.restart(time.monotonic() + self.settings.wait_s)
                self._note("restart", self.cluster.address(child))
        for child in self.cluster.data_nodes:
            address = self.cluster.address(child)
            if self.membership(address) == "failed":
                self.recover(address)

    # -- what the job reads ---------------------------------------------------------------

    def _note(self, kind: str, node: str, detail: str = "") -> None:
        event = Event(time.time(), kind, node, detail)
        with self._lock:
            counts = self._counts
            counts.events.append(event)
            counts.kills += kind == "kill"
            counts.failovers += kind == "failover"
            counts.recovered += kind == "recovered"
        self.on_event(event)

    def _set_now(self, text: str) -> None:
        with self._lock:
            self._counts.now = text

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._counts.events)

    @property
    def failovers(self) -> int:
        with self._lock:
            return self._counts.failovers

    @property
    def recovered(self) -> int:
        with self._lock:
            return self._counts.recovered

    def summary(self) -> str:
        """The live line's part: counts, and what the running round waits for."""
        with self._lock:
            c = self._counts
            line = f"chaos: {c.kills} kills, {c.failovers} failovers, {c.recovered} recovered"
            return line + (f" ({c.now})" if c.now else "")

    def cancel(self) -> None:
        """No further round (a forced stop: the running one is left to the daemon thread)."""
        self._stop_event.set()

    def stop(self) -> None:
        """Stop between rounds: a running round ends first (every node back)."""
        self._stop_event.set()
        if self.is_alive():
            self._idle.wait()

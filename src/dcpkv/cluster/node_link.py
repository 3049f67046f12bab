"""The manager's side of one data node: the admin session and the CAS-ordered state changes.

Theory of operation
-------------------
A :class:`NodeLink` speaks memcached to one node as the cluster admin, through the client
library (never the server's code): one asyncio :class:`~dcpkv.client.connection.Connection`
per bucket, opened on first use and reopened after it breaks. It answers the questions the
manager asks (which vbuckets the node holds in which state, ``stat vbucket``; the config it
serves; high and persisted seqnos) and carries out the two commands it gives: a vbucket state
(SetVbucket) and the map (SetClusterConfig).

State changes follow spec 002, "ordering of partition state transitions": every SetVbucket
carries the bucket's state CAS as the link last noted it. The first one is read with GetVbucket,
which carries it whether or not the node holds that vbucket (a node holding none answers
NotMyVbucket with the CAS), so discovering it changes nothing. An accepted change answers with
the new CAS, noted for the next. A refusal (KeyExists) carries the current CAS: someone else
changed a state since (another manager, an operator, a node restart). The link notes it, counts
a conflict and sends the command again, a bounded number of times: the manager's decision
stands, so re-sending it with the fresh CAS is the spec's "record the correct CAS and retry".
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dcpkv.client.connection import AuthError, ClientError, Connection, authenticate
from dcpkv.cluster.failover import ReplicaSeqnos
from dcpkv.core.deadline import within
from dcpkv.core.errors import DcpkvError
from dcpkv.core.manager_term import agent_for
from dcpkv.core.status import Status, status_name
from dcpkv.core.tls import TlsError, TlsSettings
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol import kv
from dcpkv.protocol.constants import Datatype

log = logging.getLogger("dcpkv.cluster")

CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 10.0
CAS_RETRIES = 5
T = TypeVar("T")


class NodeLinkError(DcpkvError):
    """A node is unreachable, refused the admin, or refused a command (``status``: how)."""

    def __init__(self, message: str, status: Status | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Counters:
    """What the links did, shown in the manager's status (tests count state changes)."""

    set_vbucket_sent: int = 0
    cas_conflicts: int = 0
    maps_pushed: int = 0
    users_pushed: int = 0
    topologies_sent: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "setVbucketSent": self.set_vbucket_sent,
            "casConflicts": self.cas_conflicts,
            "mapsPushed": self.maps_pushed,
            "usersPushed": self.users_pushed,
            "topologiesSent": self.topologies_sent,
        }


@dataclass(frozen=True, slots=True)
class LinkTls:
    """How the manager's links speak TLS: the CA to trust, and where a node's TLS port is
    (its data port plus ``port_offset``: Couchbase's convention is 11210 -> 11207, -3)."""

    options: TlsSettings
    port_offset: int = -3


class NodeLink:
    def __init__(
        self,
        name: str,
        user: str,
        password: str,
        counters: Counters,
        tls: LinkTls | None = None,
        term: int = 0,
    ) -> None:
        self.name = name
        self.term = term  # the leader's term over etcd (0: none), named in each Hello
        host, _, port = name.rpartition(":")
        self.host, self.port = host, int(port)
        # The node keeps its name (its data address, what clients see in the map); the link
        # itself may go to its TLS port.
        self._tls = tls.options if tls is not None else None
        self._link_port = self.port + tls.port_offset if tls is not None else self.port
        self._user, self._password = user, password
        self._sessions: dict[str, Connection] = {}
        self._state_cas: dict[str, int] = {}
        self.counters = counters
        # A session was opened after another: the node may have restarted (lost its
        # topologies, its map), so the manager syncs it again; the sync clears it.
        self.reconnected = False
        self._opened = 0

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for conn in sessions:
            await conn.close()

    async def _session(self, bucket: str) -> Connection:
        conn = self._sessions.get(bucket)
        if conn is not None and conn.error is None:
            return conn
        self._sessions.pop(bucket, None)
        self._state_cas.pop(bucket, None)  # a new session may face a restarted node
        try:
            conn = await Connection.open(self.host, self._link_port, CONNECT_TIMEOUT_S, self._tls)
        except (OSError, TimeoutError, TlsError) as exc:
            raise NodeLinkError(f"cannot reach {self.name}: {exc or type(exc).__name__}") from None
        try:
            await within(authenticate(conn, self._user, self._password, bucket), CONNECT_TIMEOUT_S)
        except AuthError as exc:
            await conn.close()
            message = f"{self.name} refused the cluster admin or bucket {bucket!r}: {exc}"
            raise NodeLinkError(message) from None
        except (OSError, TimeoutError, ClientError) as exc:
            await conn.close()
            raise NodeLinkError(f"cannot log in to {self.name}: {exc}") from None
        if self.term:  # a manager over etcd names its term: nodes fence older ones
            try:
                await within(conn.call(kv.Hello(agent=agent_for(self.term))), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError, ClientError) as exc:
                await conn.close()
                raise NodeLinkError(f"cannot say hello to {self.name}: {exc}") from None
        self._sessions[bucket] = conn
        self._opened += 1
        self.reconnected = self.reconnected or self._opened > 1
        return conn

    async def _call(self, bucket: str, msg: kv.Request) -> Any:
        conn = await self._session(bucket)
        try:
            return await within(conn.call(msg), CALL_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            await conn.close()
            self._sessions.pop(bucket, None)
            raise NodeLinkError(f"{self.name} did not answer: {exc or 'timeout'}") from None

    # -- questions --------------------------------------------------------------------------

    async def _stat_rows(self, bucket: str, group: str) -> list[tuple[str, str]]:
        conn = await self._session(bucket)
        try:
            return await within(conn.stats(group), CALL_TIMEOUT_S)
        except (OSError, TimeoutError, ClientError) as exc:
            raise NodeLinkError(f"{self.name}: stat {group} failed: {exc}") from None

    async def states(self, bucket: str) -> dict[int, VBucketState]:
        """vbucket -> state, for every vbucket the node holds (dead ones included)."""
        rows = await self._stat_rows(bucket, "vbucket")
        return {int(name[3:]): VBucketState.of(value) for name, value in rows if name[:3] == "vb_"}

    async def topologies(self, bucket: str) -> dict[int, str]:
        """Active vbucket -> the replication topology it holds (JSON; empty: none)."""
        rows = await self._stat_rows(bucket, "vbucket-topology")
        return {int(name[3:]): value for name, value in rows if name[:3] == "vb_"}

    async def metrics_port(self, bucket: str) -> int:
        """The node's Prometheus port (``stat`` metrics_port; 0: it serves none)."""
        conn = await self._session(bucket)
        try:
            rows = dict(await within(conn.stats(""), CALL_TIMEOUT_S))
        except (OSError, TimeoutError, ClientError) as exc:
            raise NodeLinkError(f"{self.name}: stat failed: {exc}") from None
        return int(rows.get("metrics_port") or 0)

    async def served_config(self, bucket: str) -> dict[str, Any]:
        answer = await self._call(bucket, kv.GetClusterConfig())
        if not isinstance(answer, kv.GetClusterConfigResponse):
            raise NodeLinkError(f"{self.name}: GetClusterConfig: {_status(answer)}")
        return json.loads(bytes(answer.config))

    async def high_seqnos(self, bucket: str, state: VBucketState | None) -> dict[int, int]:
        """vbucket -> high seqno, of the vbuckets in ``state`` (None: all but dead ones)."""
        answer = await self._call(bucket, kv.GetAllVbSeqnos(state=state))
        if not isinstance(answer, kv.GetAllVbSeqnosResponse):
            raise NodeLinkError(f"{self.name}: GetAllVbSeqnos: {_status(answer)}")
        return dict(answer.seqnos)

    async def replica_seqnos(self, bucket: str, vbuckets: list[int]) -> dict[int, ReplicaSeqnos]:
        """vbucket -> what a failover compares (high prepared seqno, high seqno, persisted
        seqno), from one ``stat vbucket-details``; vbuckets the node does not hold, or holds
        dead, are left out."""
        details = await self.vbucket_details(bucket)
        out: dict[int, ReplicaSeqnos] = {}
        for vb in vbuckets:
            row = details.get(vb)
            if row is not None and row["state"] != VBucketState.DEAD.label:
                out[vb] = ReplicaSeqnos(
                    int(row["high_prepared_seqno"]),
                    int(row["high_seqno"]),
                    int(row["persistence_seqno"]),
                )
        return out

    async def vbucket_details(self, bucket: str) -> dict[int, dict[str, str]]:
        """vbucket -> its ``stat vbucket-details`` (state, seqnos, topology...), as strings."""
        rows = await self._stat_rows(bucket, "vbucket-details")
        out: dict[int, dict[str, str]] = {}
        for name, value in rows:
            vb, _, field = name[3:].partition(":")
            out.setdefault(int(vb), {})[field] = value
        return out

    async def vbucket_views(
        self, bucket: str, vbuckets: list[int]
    ) -> dict[int, tuple[VBucketState | None, int, int]]:
        """vbucket -> (state or None when not held, high seqno, persisted seqno), asking
        about these vbuckets only (``stat vbucket N``, ``stat vbucket-seqno N``, ObserveSeqno
        for a copy that is not dead), all at once: what a rebalance watches every tick."""
        conn = await self._session(bucket)
        answers = await self._at_once(
            bucket, conn, [self._vbucket_view(conn, vb) for vb in vbuckets]
        )
        return dict(zip(vbuckets, answers, strict=True))

    async def _at_once(self, bucket: str, conn: Connection, calls: list[Awaitable[T]]) -> list[T]:
        """Every call on the session at once, their answers in order; a session that fails
        or times out is closed (the next question opens a new one)."""
        try:
            return await within(asyncio.gather(*calls), CALL_TIMEOUT_S)
        except (OSError, TimeoutError, ClientError) as exc:
            await conn.close()
            self._sessions.pop(bucket, None)
            raise NodeLinkError(f"{self.name} did not answer: {exc or 'timeout'}") from None

    async def vbucket_states(
        self, bucket: str, vbuckets: list[int]
    ) -> dict[int, VBucketState | None]:
        """vbucket -> its state here (None: not held), GetVbucket for each at once: what a
        rebalance watches while vbuckets are handed over, as often as it can afford."""
        conn = await self._session(bucket)
        answers = await self._at_once(
            bucket, conn, [conn.call(kv.GetVbucket(vbucket=vb)) for vb in vbuckets]
        )
        out: dict[int, VBucketState | None] = {}
        for vb, answer in zip(vbuckets, answers, strict=True):
            if isinstance(answer, kv.GetVbucketResponse):
                out[vb] = VBucketState.of(answer.state)
            elif getattr(answer, "status", None) == Status.NotMyVbucket:
                out[vb] = None
            else:
                raise NodeLinkError(f"{self.name}: GetVbucket {vb}: {_status(answer)}")
        return out

    @staticmethod
    async def _vbucket_view(conn: Connection, vb: int) -> tuple[VBucketState | None, int, int]:
        try:
            state_rows = await conn.stats(f"vbucket {vb}")
            seqno_rows = dict(await conn.stats(f"vbucket-seqno {vb}"))
        except ClientError as exc:
            if exc.status == Status.NotMyVbucket:
                return None, 0, 0  # the node holds no copy
            raise
        state = VBucketState.of(state_rows[0][1])
        high = int(seqno_rows[f"vb_{vb}:high_seqno"])
        if state == VBucketState.DEAD:
            return state, high, 0
        uuid = int(seqno_rows[f"vb_{vb}:uuid"])
        answer = await conn.call(kv.ObserveSeqno(vbucket=vb, vbucket_uuid=uuid))
        persisted = (
            answer.last_persisted_seqno if isinstance(answer, kv.ObserveSeqnoResponse) else 0
        )
        return state, high, persisted

    async def stat_group(self, bucket: str, group: str = "") -> list[tuple[str, str]]:
        """One ``stat`` group's rows as the node answers them (the web console's figures)."""
        conn = await self._session(bucket)
        return (await self._at_once(bucket, conn, [conn.stats(group)]))[0]

    async def noop(self, bucket: str) -> None:
        answer = await self._call(bucket, kv.Noop())
        if getattr(answer, "status", Status.Success) != Status.Success:
            raise NodeLinkError(f"{self.name}: Noop: {_status(answer)}")

    # -- commands ---------------------------------------------------------------------------

    async def state_cas(self, bucket: str, held: dict[int, VBucketState]) -> int:
        """The bucket's state CAS as last noted, discovered when unknown (module docstring)."""
        cas = self._state_cas.get(bucket)
        if cas is not None:
            return cas
        # GetVbucket carries the state CAS, in its NotMyVbucket answer too (a node that holds
        # nothing yet), so reading it never changes anything.
        answer = await self._call(bucket, kv.GetVbucket(vbucket=min(held) if held else 0))
        if getattr(answer, "status", Status.Success) not in (Status.Success, Status.NotMyVbucket):
            raise NodeLinkError(f"{self.name}: cannot read the state CAS: {_status(answer)}")
        self._state_cas[bucket] = answer.cas
        return answer.cas

    async def set_state(
        self,
        bucket: str,
        vbucket: int,
        state: VBucketState,
        held: dict[int, VBucketState],
        topology: bytes = b"",
    ) -> None:
        """SetVbucket with the state CAS; on a conflict, note the current CAS and retry.
        ``topology``: the replication topology an active vbucket takes with its state."""
        self.counters.set_vbucket_sent += 1
        if topology:
            self.counters.topologies_sent += 1

        def command(cas: int) -> kv.Request:
            return _set_vbucket(vbucket, state, topology, cas)

        try:
            await self._cas_ordered(bucket, held, command, f"SetVbucket {vbucket} {state}")
        except NodeLinkError as exc:
            if not topology or exc.status != Status.Einval:
                raise
            # The node refused the topology (it calls itself by another name than the map):
            # the state still changes; durable writes are refused there (DurabilityImpossible)
            log.warning("%s", exc)
            await self.set_state(bucket, vbucket, state, held)

    async def set_topologies(
        self, bucket: str, values: dict[int, bytes], held: dict[int, VBucketState]
    ) -> None:
        """SetVbucket (active, with its topology) for each of ``values``' vbuckets, all at once
        on the session: each accepted SetVbucket adds one to the state CAS, so the n-th carries
        the CAS the ones before it leave, and the batch stays CAS-ordered while pipelined. A
        refusal (another change came between) leaves the rest to go one by one."""
        if not values:
            return
        conn = await self._session(bucket)
        cas = await self.state_cas(bucket, held)
        vbs = sorted(values)
        self.counters.topologies_sent += len(vbs)
        answers = await self._at_once(
            bucket,
            conn,
            [
                conn.call(_set_vbucket(vb, VBucketState.ACTIVE, values[vb], cas + i))
                for i, vb in enumerate(vbs)
            ],
        )
        left = []
        for vb, answer in zip(vbs, answers, strict=True):
            status = getattr(answer, "status", Status.Success)
            if status == Status.Success:
                self._state_cas[bucket] = answer.cas
            elif status == Status.KeyEexists:
                left.append(vb)
            else:  # (as in set_state: durable writes are refused there meanwhile)
                log.warning("%s: SetVbucket %d topology: %s", self.name, vb, _status(answer))
        if left:
            self._state_cas.pop(bucket, None)
        for vb in left:
            await self.set_state(bucket, vb, VBucketState.ACTIVE, held, values[vb])

    async def delete_vbucket(self, bucket: str, vbucket: int) -> None:
        """DelVbucket (the copy and its data), CAS-ordered like a state change; a vbucket the
        node does not hold counts as deleted."""

        def command(cas: int) -> kv.Request:
            return kv.DelVbucket(vbucket=vbucket, cas=cas)

        try:
            await self._cas_ordered(bucket, {}, command, f"DelVbucket {vbucket}")
        except NodeLinkError as exc:
            if "NotMyVbucket" not in str(exc):
                raise

    async def _cas_ordered(
        self,
        bucket: str,
        held: dict[int, VBucketState],
        command: Callable[[int], kv.Request],
        what: str,
    ) -> None:
        cas = await self.state_cas(bucket, held)
        for _ in range(CAS_RETRIES):
            answer = await self._call(bucket, command(cas))
            if answer.status == Status.Success:
                self._state_cas[bucket] = answer.cas
                return
            if answer.status != Status.KeyEexists:
                raise NodeLinkError(f"{self.name}: {what}: {_status(answer)}", answer.status)
            self.counters.cas_conflicts += 1
            cas = self._state_cas[bucket] = answer.cas
        raise NodeLinkError(f"{self.name}: the state CAS kept changing; gave up on {what}")

    async def push_users(self, bucket: str, users: bytes) -> None:
        """RbacRefresh: the users document (the node keeps it when its rev is newer)."""
        answer = await self._call(bucket, kv.RbacRefresh(users=users, datatype=Datatype.JSON))
        if answer.status != Status.Success:
            raise NodeLinkError(f"{self.name}: RbacRefresh: {_status(answer)}")
        self.counters.users_pushed += 1

    async def push_config(self, bucket: str, config: dict[str, Any]) -> None:
        raw = json.dumps(config, separators=(",", ":")).encode()
        msg = kv.SetClusterConfig(bucket=bucket, config=raw, datatype=Datatype.JSON)
        answer = await self._call(bucket, msg)
        if answer.status != Status.Success:
            raise NodeLinkError(f"{self.name}: SetClusterConfig: {_status(answer)}")
        self.counters.maps_pushed += 1


def _set_vbucket(vbucket: int, state: VBucketState, topology: bytes, cas: int) -> kv.Request:
    if not topology:
        return kv.SetVbucket(vbucket=vbucket, state=state, cas=cas)
    return kv.SetVbucket(
        vbucket=vbucket, state=state, meta=topology, cas=cas, datatype=Datatype.JSON
    )


def _status(answer: Any) -> str:
    text = bytes(getattr(answer, "value", b"") or b"")[:200].decode("utf-8", "replace")
    name = status_name(getattr(answer, "status", Status.Success))
    return f"{name}: {text}" if text else name

"""The asyncio KV client of a cluster: the map, one session per node, routing and retries.

Theory of operation
-------------------
:class:`ClusterKV` is the thin I/O shell around a :class:`~dcpkv.client.router.Router`. It
bootstraps by asking every seed of the connection string at once for the cluster map
(GetClusterConfig) and keeps the newest answer: any reachable seed is enough, a dead one
costs nothing but its connect attempt. It then keeps one authenticated
:class:`~dcpkv.client.kv.KVSession` per node it needs, opened on first use.

:meth:`ClusterKV.call` sends a request about a vbucket to that vbucket's active node. When the
answer is NotMyVbucket (its body may carry a map: offered to the router first), when the
node's connection breaks or cannot be opened, or when the map says nobody holds the vbucket
(mid-failover), the client refreshes the map from every node it knows and sends the request
again after a capped, jittered backoff (:class:`~dcpkv.client.router.RetrySchedule`), until
``ClientSettings.retry_timeout`` has passed: long enough to ride through an automatic failover.
Authentication failures are final at once.

A single plain node serves a map naming itself active for every vbucket, so it keeps working
as it always did; a server that answers no map at all leaves every vbucket on the first seed.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

from dcpkv.client.connection import AuthError, ClientError
from dcpkv.client.durability import (
    DurabilityOption,
    SyncWriteAmbiguousError,
    framing,
    server_durability,
    sync_write_error,
)
from dcpkv.client.kv import Document, KVSession
from dcpkv.client.router import RetrySchedule, Router
from dcpkv.client.settings import ClientSettings, Node
from dcpkv.core.deadline import within
from dcpkv.core.durability import (
    DurabilityLostError,
    DurabilityTimeoutError,
    MutationToken,
    Observation,
    Verdict,
    check_possible,
    judge,
)
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.status import Status, status_name
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol import kv, subdoc
from dcpkv.protocol.base import Message, Request, opcode_name
from dcpkv.protocol.constants import HelloFeature, Opcode
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.subdoc import Spec

log = logging.getLogger("dcpkv.client")

T = TypeVar("T")
R = TypeVar("R", bound=Request)
HELLO_FEATURES = (
    HelloFeature.MutationSeqno,
    HelloFeature.AltRequestSupport,
    HelloFeature.SyncReplication,
)
_SEQNO_EXTRAS = struct.Struct(">QQ")  # a sub-document mutation's (vbucket uuid, seqno)
# A node we cannot talk to right now: refresh the map and try again (it may have moved).
NODE_ERRORS = (ConnectionError, OSError, TimeoutError, CodecError)


class NoRouteError(ClientError):
    """The request could not reach the vbucket's active node before the retry deadline."""


class ClusterKV:
    """The asyncio KV client of a bucket on a cluster (or one node): Get and Set routed to each
    vbucket's active node by the cluster map, retried across failovers and moves, and durable
    writes::

        async with await ClusterKV.open(ClientSettings(ConnectionSettings.at(port=11210))) as kv:
            token = await kv.upsert(b"key", b"value", persist_to=1)  # on the active's disk

    :meth:`upsert` returns the write's :class:`~dcpkv.core.durability.MutationToken` once
    ``persist_to`` nodes (the active counts) persisted it and ``replicate_to`` replicas hold
    it (ObserveSeqno polling, :meth:`wait_durable`). The module docstring gives the retries.
    """

    def __init__(self, config: ClientSettings) -> None:
        self.config = config
        self.router = Router(config.connection.nodes, tls=config.connection.tls is not None)
        self._sessions: dict[Node, KVSession] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._opening: dict[Node, asyncio.Future[KVSession]] = {}
        self.counters = {"refreshes": 0, "not_my_vbucket": 0, "node_errors": 0}

    @classmethod
    async def open(cls, config: ClientSettings) -> ClusterKV:
        """Bootstrapped: a map from a reachable seed (or the first seed alone, when it serves
        none). While no seed can be reached (a node restarting) it tries again with bounded
        backoff, and raises once ``retry_timeout`` has passed; a refused login raises at once."""
        self = cls(config)
        loop = asyncio.get_running_loop()
        schedule = RetrySchedule(loop.time(), config.retry_timeout, config.max_backoff)
        try:
            while True:
                try:
                    await self.refresh(self.router.seeds, strict=True)
                    return self
                except NODE_ERRORS as exc:
                    delay = schedule.next_delay(loop.time())
                    if delay is None:
                        raise
                    log.info("bootstrap: %s; again in %.2f s", exc, delay)
                    await asyncio.sleep(delay)
        except BaseException:
            await self.close()
            raise

    async def __aenter__(self) -> ClusterKV:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for opening in list(self._opening.values()):
            opening.cancel()
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()

    # -- sessions and the map ---------------------------------------------------------------

    async def session(self, node: Node) -> KVSession:
        """The authenticated session to ``node``, opened (again) when needed; callers asking
        at the same time share one opening (pipelined Gets must not open a connection each)."""
        session = self._sessions.get(node)
        if session is not None and session.alive:
            return session
        opening = self._opening.get(node)
        if opening is None:
            opening = self._opening[node] = asyncio.ensure_future(self._open_session(node))
            opening.add_done_callback(lambda done: self._opened(node, done))
        # shielded: a caller that gives up (its timeout) does not cancel the others' opening
        return await asyncio.shield(opening)

    def _opened(self, node: Node, done: asyncio.Future[KVSession]) -> None:
        self._opening.pop(node, None)
        if not done.cancelled():
            done.exception()  # retrieved here: every waiter may have given up already

    async def _open_session(self, node: Node) -> KVSession:
        old = self._sessions.pop(node, None)
        if old is not None:
            await old.close()
        session = await KVSession.open(self.config, node.host, node.port)
        try:
            # Writes answer with their (vbucket uuid, seqno): the token durability needs;
            # flex frames carry durability requirements (SyncWrites).
            await session.conn.call(kv.Hello(agent="dcpkv-client", features=HELLO_FEATURES))
        except BaseException:
            await session.close()
            raise
        self._sessions[node] = session
        return session

    async def drop(self, node: Node) -> None:
        session = self._sessions.pop(node, None)
        if session is not None:
            await session.close()

    async def refresh(
        self, nodes: list[Node] | tuple[Node, ...] | None = None, *, strict: bool = False
    ) -> None:
        """Ask ``nodes`` (default: every node known) for the map at once; keep the newest.
        ``strict``: raise when none answered (bootstrap)."""
        targets = list(nodes) if nodes is not None else self.router.candidates()
        self.counters["refreshes"] += 1
        results = await asyncio.gather(
            *(self._map_from(n) for n in targets), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for exc in errors:
            if isinstance(exc, AuthError):
                raise exc
        if strict and len(errors) == len(targets):
            names = ", ".join(str(n) for n in targets)
            raise ConnectionError(f"no node of {names} could be reached: {errors[0]}")

    async def _map_from(self, node: Node) -> None:
        # A node that accepts connections but does not answer (stopped) must not hold up a
        # refresh, which every retry waits for, past request_timeout.
        try:
            session = await within(self.session(node), self.config.connect_timeout)
            answer = await within(
                session.conn.call(kv.GetClusterConfig()), self.config.request_timeout
            )
        except NODE_ERRORS:
            await self.drop(node)
            raise
        if isinstance(answer, kv.GetClusterConfigResponse):
            self.router.offer(bytes(answer.config), node)

    # -- routed requests --------------------------------------------------------------------

    async def call(self, vbucket: int, msg: Request) -> Message:
        """``msg`` (about ``vbucket``) answered by the vbucket's active node, any status but
        NotMyVbucket; see the module docstring for the retries."""

        async def attempt(session: KVSession) -> Message | None:
            answer = await session.conn.call(msg)
            if getattr(answer, "status", Status.Success) != Status.NotMyVbucket:
                return answer
            self.counters["not_my_vbucket"] += 1
            self.router.offer(bytes(getattr(answer, "value", b"") or b""))
            return None

        return await self.on_active(vbucket, attempt, what=type(msg).__name__)

    async def on_active(
        self,
        vbucket: int,
        attempt: Callable[[KVSession], Awaitable[T | None]],
        *,
        what: str = "request",
        timeout: float | None = None,
    ) -> T:
        """Run ``attempt`` on the session of the vbucket's active node until it returns
        something other than None (None: "not here, route again"); each attempt may take
        ``timeout`` (default: the config's request_timeout)."""
        return await self.retrying(
            lambda: self.router.active(vbucket), attempt, what=what, timeout=timeout
        )

    async def retrying(
        self,
        route: Callable[[], Node | None],
        attempt: Callable[[KVSession], Awaitable[T | None]],
        *,
        what: str = "request",
        timeout: float | None = None,
    ) -> T:
        """The retry loop under :meth:`on_active`, for any routing rule."""
        timeout = self.config.request_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        schedule = RetrySchedule(loop.time(), self.config.retry_timeout, self.config.max_backoff)
        last = "no attempt"
        while True:
            node = route()
            if node is None:
                last = "no node holds the vbucket active (failover under way?)"
            else:
                try:
                    session = await within(self.session(node), self.config.connect_timeout)
                    result = await within(attempt(session), timeout)
                except AuthError:
                    raise
                except NODE_ERRORS as exc:
                    self.counters["node_errors"] += 1
                    last = f"{node}: {exc or type(exc).__name__}"
                    await self.drop(node)
                else:
                    if result is not None:
                        return result
                    last = f"{node}: {status_name(Status.NotMyVbucket)}"
            delay = schedule.next_delay(loop.time())
            if delay is None:
                raise NoRouteError(f"{what}: gave up after {self.config.retry_timeout:g} s: {last}")
            log.debug("%s: %s; retrying in %.2f s", what, last, delay)
            await asyncio.sleep(delay)
            await self.refresh_once()

    async def refresh_once(self) -> None:
        """One map refresh shared by every request that wants one at the same time."""
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)
            return
        self._refreshing = asyncio.get_running_loop().create_future()
        try:
            await self.refresh()
        except AuthError:
            raise
        except Exception as exc:  # every node down right now: the next retry tries again
            log.debug("map refresh failed: %s", exc)
        finally:
            self._refreshing.set_result(None)
            self._refreshing = None

    # -- what a DCP consumer asks outside its streams ------------------------------------------

    def bucket_vbuckets(self) -> list[int]:
        """The vbuckets of the bucket: those the map gives a node (active or replica)."""
        m = self.router.map
        if m is None:
            return []
        return [vb for vb, chain in enumerate(m.chains) if any(i >= 0 for i in chain)]

    async def vbucket_seqnos(self, vbucket: int | None = None) -> dict[int, tuple[int, int]]:
        """vbucket -> (vbucket uuid, high seqno), each read from the vbucket's active."""
        if self.router.map is None:
            return await (await self.session(self.router.seeds[0])).vbucket_seqnos(vbucket)
        vbs = self.bucket_vbuckets() if vbucket is None else [vbucket]
        return await self._from_actives(vbs, _seqnos, "vbucket-seqno")

    async def failover_log(self, vbucket: int) -> tuple[FailoverEntry, ...]:
        return (await self.failover_logs([vbucket]))[vbucket]

    async def failover_logs(self, vbuckets: Iterable[int]) -> dict[int, tuple[FailoverEntry, ...]]:
        """Each vbucket's failover log, read from its active."""
        return await self._from_actives(list(vbuckets), _failover_logs, "GetFailoverLog")

    async def _from_actives(self, vbuckets: list[int], ask: AskNode[T], what: str) -> dict[int, T]:
        """``ask`` each node for the vbuckets the map makes it active for.

        A node's vbucket-seqno stat and GetFailoverLog answer for its replicas and dead
        copies too (as kv_engine's do), and the map may be older than the nodes' states: a
        consumer kept across batches meets no NotMyVbucket to learn from. A replica's seqnos
        or log taken for the active's make a planner see a rollback that is not there (the
        Spark source then rolled back, or resynced, whole vbuckets for nothing). So an answer
        counts only when the node holds the vbucket active now (GetAllVbSeqnos, asked in the
        same round trip);
        the rest is asked again after a map refresh (a move or failover is under way, or was
        missed), until ``retry_timeout``. The map is refreshed first: a node restarted after a
        failover holds its old vbuckets active (its disk's states) until the manager tells it
        otherwise, and a client whose map predates the failover would take its word."""
        await self.refresh_once()
        out: dict[int, T] = {}
        pending = set(vbuckets)
        loop = asyncio.get_running_loop()
        schedule = RetrySchedule(loop.time(), self.config.retry_timeout, self.config.max_backoff)
        while True:
            for node, vbs in self.router.actives_by_node(sorted(pending)).items():
                try:
                    session = await within(self.session(node), self.config.connect_timeout)
                    answers, active = await within(
                        _with_actives(session, vbs, ask), self.config.request_timeout
                    )
                except NODE_ERRORS:
                    await self.drop(node)
                    continue
                for vb in vbs:
                    if vb in answers and vb in active:
                        out[vb] = answers[vb]
                        pending.discard(vb)
            if not pending:
                return dict(sorted(out.items()))
            delay = schedule.next_delay(loop.time())
            if delay is None:
                raise NoRouteError(f"{what}: no active reached for {len(pending)} vbuckets")
            await asyncio.sleep(delay)
            await self.refresh_once()

    async def get(self, vbucket: int, key: bytes) -> Document | None:
        """The current document (None: no such key), read from the active."""
        found = await self.on_active(
            vbucket, lambda s: _held(_boxed(s.get(vbucket, key))), what="Get"
        )
        return found[0]

    async def get_many(self, vbucket: int, keys: list[bytes]) -> list[Document | None]:
        return list(await asyncio.gather(*(self.get(vbucket, k) for k in keys)))

    # -- writes and durability ----------------------------------------------------------------

    def vbucket_of(self, key: bytes) -> int:
        m = self.router.map
        if m is None:
            raise ClientError("no cluster map: the number of vbuckets is unknown")
        return vbucket_for_key(key, m.num_vbuckets)

    async def upsert(
        self,
        key: bytes,
        value: bytes,
        *,
        flags: int = 0,
        expiry: int = 0,
        persist_to: int = 0,
        replicate_to: int = 0,
        timeout: float = 10.0,
        durability: DurabilityOption = None,
    ) -> MutationToken:
        """Set ``key`` on its active; returns once the durability requirement holds: with
        ``durability`` (a :class:`~dcpkv.client.durability.ServerDurability` or level) once
        the server committed it at that level (a SyncWrite); with ``persist_to`` /
        ``replicate_to`` once polling saw it there (:meth:`wait_durable`); with neither, once
        the active acknowledged it."""
        vb = self.vbucket_of(key)
        # refused before writing: a requirement the bucket cannot meet must not write at all
        check_possible(persist_to, replicate_to, len(self.router.replicas(vb)))
        msg = kv.Set(key=key, value=value, flags=flags, expiration=expiry, vbucket=vb)
        token = _token(vb, await self.mutate(msg, durability))
        if persist_to or replicate_to:
            await self.wait_durable(
                token, persist_to=persist_to, replicate_to=replicate_to, timeout=timeout
            )
        return token

    async def insert(
        self, key: bytes, value: bytes, *, flags: int = 0, expiry: int = 0,
        durability: DurabilityOption = None,
    ) -> MutationToken:  # fmt: skip
        """Add ``key`` (KeyExists when it exists)."""
        msg = self._routed(kv.Add(key=key, value=value, flags=flags, expiration=expiry))
        return _token(msg.vbucket, await self.mutate(msg, durability))

    async def replace(
        self, key: bytes, value: bytes, *, flags: int = 0, expiry: int = 0, cas: int = 0,
        durability: DurabilityOption = None,
    ) -> MutationToken:  # fmt: skip
        """Replace ``key`` (KeyEnoent when it does not exist; KeyExists on a CAS mismatch)."""
        msg = self._routed(
            kv.Replace(key=key, value=value, flags=flags, expiration=expiry, cas=cas)
        )
        return _token(msg.vbucket, await self.mutate(msg, durability))

    async def remove(
        self, key: bytes, *, cas: int = 0, durability: DurabilityOption = None
    ) -> MutationToken:
        """Delete ``key`` (KeyEnoent when it does not exist)."""
        msg = self._routed(kv.Delete(key=key, cas=cas))
        return _token(msg.vbucket, await self.mutate(msg, durability))

    async def append(
        self, key: bytes, value: bytes, *, durability: DurabilityOption = None
    ) -> MutationToken:
        """Append ``value`` to ``key``'s value (NotStored when it does not exist)."""
        msg = self._routed(kv.Append(key=key, value=value))
        return _token(msg.vbucket, await self.mutate(msg, durability, idempotent=False))

    async def prepend(
        self, key: bytes, value: bytes, *, durability: DurabilityOption = None
    ) -> MutationToken:
        """Prepend ``value`` to ``key``'s value (NotStored when it does not exist)."""
        msg = self._routed(kv.Prepend(key=key, value=value))
        return _token(msg.vbucket, await self.mutate(msg, durability, idempotent=False))

    async def incr(
        self, key: bytes, delta: int = 1, *, initial: int = 0, expiry: int = 0,
        durability: DurabilityOption = None,
    ) -> tuple[int, MutationToken]:  # fmt: skip
        """Add ``delta`` to the counter at ``key`` (created at ``initial``); the new value."""
        msg = kv.Increment(key=key, delta=delta, initial=initial, expiration=expiry)
        return await self._counter(self._routed(msg), durability)

    async def decr(
        self, key: bytes, delta: int = 1, *, initial: int = 0, expiry: int = 0,
        durability: DurabilityOption = None,
    ) -> tuple[int, MutationToken]:  # fmt: skip
        """Subtract ``delta`` from the counter at ``key`` (never below 0); the new value."""
        msg = kv.Decrement(key=key, delta=delta, initial=initial, expiration=expiry)
        return await self._counter(self._routed(msg), durability)

    async def mutate_in(
        self, key: bytes, specs: Sequence[Spec], *, expiry: int = 0, doc_flags: int = 0,
        cas: int = 0, durability: DurabilityOption = None,
    ) -> MutationToken:  # fmt: skip
        """Sub-document mutations of ``key`` (:class:`~dcpkv.protocol.subdoc.Spec`s of the
        mutation opcodes), applied together (SubdocMultiMutation; one spec: its own opcode)."""
        if len(specs) == 1 and specs[0].opcode in subdoc.SINGLE_OPS:
            opcode = specs[0].opcode
        else:
            opcode = Opcode.SubdocMultiMutation
        msg = subdoc.SubdocRequest(
            opcode=opcode, key=key, specs=tuple(specs), expiry=expiry, doc_flags=doc_flags,
            cas=cas,
        )  # fmt: skip
        answer = await self.mutate(self._routed(msg), durability, idempotent=False)
        extras = bytes(getattr(answer, "extras", b""))
        if len(extras) != _SEQNO_EXTRAS.size:
            raise ClientError(f"{opcode_name(opcode)}: no mutation token in the answer")
        uuid, seqno = _SEQNO_EXTRAS.unpack(extras)
        return MutationToken(msg.vbucket, uuid, seqno)

    async def _counter(
        self, msg: kv.Increment, durability: DurabilityOption
    ) -> tuple[int, MutationToken]:
        answer = await self.mutate(msg, durability, idempotent=False)
        if not isinstance(answer, kv.IncrementResponse):
            raise ClientError(f"{type(msg).__name__}: unexpected answer {answer!r}")
        return answer.counter, _token(msg.vbucket, answer)

    def _routed(self, msg: R) -> R:
        msg.vbucket = self.vbucket_of(bytes(msg.key))  # type: ignore[attr-defined]
        return msg

    async def mutate(
        self, msg: Request, durability: DurabilityOption = None, *, idempotent: bool = True
    ) -> Message:
        """``msg`` (a mutation of ``msg.vbucket``) sent to its active with ``durability``; the
        successful answer, else its error (:func:`~dcpkv.client.durability.sync_write_error`
        for the SyncWrite statuses, ClientError for the rest). A write that is not
        ``idempotent`` (Append, Incr...) is never sent again once a node took it without
        answering: that raises SyncWriteAmbiguousError (read the key to learn the outcome)."""
        what = type(msg).__name__ if not isinstance(msg, subdoc.SubdocRequest) else "Subdoc"
        required = server_durability(durability)
        frame_extras = framing(required)
        # a SyncWrite's answer comes when it commits: allow its timeout on top
        wait = self.config.request_timeout + (0 if required is None else required.wait_s)
        in_flight = False

        async def attempt(session: KVSession) -> Message | None:
            nonlocal in_flight
            if in_flight and not idempotent:
                raise SyncWriteAmbiguousError(
                    f"{what}: the connection broke before the answer", Status.SyncWriteAmbiguous
                )
            in_flight = True
            answer = await session.conn.call(msg, frame_extras)
            in_flight = False
            if getattr(answer, "status", Status.Success) != Status.NotMyVbucket:
                return answer
            self.counters["not_my_vbucket"] += 1
            self.router.offer(bytes(getattr(answer, "value", b"") or b""))
            return None

        answer = await self.on_active(msg.vbucket, attempt, what=what, timeout=wait)
        status = getattr(answer, "status", Status.Success)
        if status in (Status.Success, Status.SubdocSuccessDeleted):
            return answer
        error = sync_write_error(status, what)
        if error is not None:
            raise error
        message = bytes(getattr(answer, "value", b"") or b"").decode("utf-8", "replace")[:200]
        raise ClientError(f"{what}: {status_name(status)} {message}".rstrip(), status)

    async def observe(
        self, node: Node, token: MutationToken, *, active: bool, timeout: float | None = None
    ) -> Observation:
        """``node``'s ObserveSeqno answer about ``token`` (raises when it gave none)."""
        timeout = self.config.request_timeout if timeout is None else timeout
        session = await within(self.session(node), timeout)
        msg = kv.ObserveSeqno(vbucket=token.vbucket, vbucket_uuid=token.vbucket_uuid)
        answer = await within(session.conn.call(msg), timeout)
        if isinstance(answer, kv.ObserveSeqnoResponse):
            return Observation(
                active,
                answer.last_persisted_seqno,
                answer.current_seqno,
                branch_end=answer.last_received_seqno,
            )
        status = getattr(answer, "status", None)
        if status == Status.KeyEnoent:  # the uuid is not in that node's failover log
            return Observation(active, known=False)
        raise ClientError(f"ObserveSeqno: {status_name(status or 0)}", status)

    async def wait_durable(
        self,
        token: MutationToken,
        *,
        persist_to: int = 0,
        replicate_to: int = 0,
        timeout: float = 10.0,
    ) -> None:
        """Poll ObserveSeqno on the vbucket's active and replicas until ``persist_to`` nodes
        (the active counts) persisted the write and ``replicate_to`` replicas hold it.
        Raises DurabilityLostError when a failover may have lost the write,
        DurabilityTimeoutError after ``timeout``, DurabilityImpossibleError when the bucket
        has too few replicas (``dcpkv.core.durability``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pause = 0.002
        while True:
            check_possible(persist_to, replicate_to, len(self.router.replicas(token.vbucket)))
            # a replica that does not answer must not hold the caller past its timeout
            budget = min(self.config.request_timeout, max(0.05, deadline - loop.time()))
            observations = await self._observations(token, budget)
            verdict = judge(token, observations, persist_to, replicate_to)
            if verdict is Verdict.MET:
                return
            if verdict is Verdict.LOST:
                raise DurabilityLostError(
                    f"vbucket {token.vbucket}: a failover since seqno {token.seqno} of branch "
                    f"{token.vbucket_uuid} may have lost the write: read the document again"
                )
            if loop.time() >= deadline:
                raise DurabilityTimeoutError(
                    f"vbucket {token.vbucket} seqno {token.seqno}: persist_to={persist_to} "
                    f"replicate_to={replicate_to} not met within {timeout:g} s: {observations}"
                )
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            pause = min(pause * 2, 0.05)

    async def wait_persisted(
        self, node: Node, token: MutationToken, *, timeout: float = 30.0
    ) -> None:
        """Block on ``node`` (the vbucket's active or a replica) until it has persisted the
        write (SeqnoPersistence, 0xb7, with the token's uuid: the failover-id check).
        DurabilityLostError when the node's history no longer holds the write."""
        session = await within(self.session(node), self.config.connect_timeout)
        msg = kv.SeqnoPersistence(
            vbucket=token.vbucket, seqno=token.seqno, vbucket_uuid=token.vbucket_uuid
        )
        answer = await within(session.conn.call(msg), timeout)
        status = getattr(answer, "status", Status.Success)
        if status == Status.Success:
            return
        if status == Status.KeyEnoent:
            raise DurabilityLostError(
                f"{node}: vbucket {token.vbucket} no longer holds seqno {token.seqno} of "
                f"branch {token.vbucket_uuid}: a failover may have lost the write"
            )
        raise ClientError(f"SeqnoPersistence on {node}: {status_name(status)}", status)

    async def _observations(self, token: MutationToken, budget: float) -> list[Observation]:
        """The active's answer (routed, retried) and every replica's that answers."""
        vb = token.vbucket

        async def on_active(session: KVSession) -> Observation | None:
            try:
                return await self.observe(self._node_of(session), token, active=True)
            except ClientError as exc:
                if exc.status == Status.NotMyVbucket:
                    return None
                raise

        found = [await self.on_active(vb, on_active, what="ObserveSeqno")]
        for node in self.router.replicas(vb):
            try:
                found.append(await self.observe(node, token, active=False, timeout=budget))
            except ClientError:  # not (yet) a replica there: it counts for nothing
                continue
            except NODE_ERRORS:  # a replica down counts for nothing
                await self.drop(node)
        return found

    def _node_of(self, session: KVSession) -> Node:
        return next(n for n, s in self._sessions.items() if s is session)


def _token(vbucket: int, answer: Message) -> MutationToken:
    """The token of a write's answer (MutationSeqno was negotiated: it carries one)."""
    uuid, seqno = getattr(answer, "vbucket_uuid", None), getattr(answer, "seqno", None)
    if uuid is None or seqno is None:
        raise ClientError(f"{type(answer).__name__}: no mutation token in the answer")
    return MutationToken(vbucket, uuid, seqno)


async def _boxed(result: Awaitable[T]) -> tuple[T]:
    """``(result,)``: a None result (no such key) must not read as "not here"."""
    return (await result,)


# What :meth:`ClusterKV._from_actives` asks a node: answers for (some of) the vbuckets given.
AskNode = Callable[[KVSession, list[int]], Awaitable[dict[int, T]]]


async def _with_actives(
    session: KVSession, vbuckets: list[int], ask: AskNode[T]
) -> tuple[dict[int, T], set[int]]:
    """``ask``'s answers and the vbuckets ``session``'s node holds active, in one round trip."""
    answers, active = await asyncio.gather(ask(session, vbuckets), session.active_vbuckets())
    return answers, active


async def _seqnos(session: KVSession, vbuckets: list[int]) -> dict[int, tuple[int, int]]:
    rows = await _held(session.vbucket_seqnos(vbuckets[0] if len(vbuckets) == 1 else None))
    return rows or {}


async def _failover_logs(
    session: KVSession, vbuckets: list[int]
) -> dict[int, tuple[FailoverEntry, ...]]:
    logs = await asyncio.gather(*(_held(session.failover_log(vb)) for vb in vbuckets))
    return {vb: log for vb, log in zip(vbuckets, logs, strict=True) if log is not None}


async def _held(result: Awaitable[T]) -> T | None:
    """``result``, or None when the node answered NotMyVbucket (route again)."""
    try:
        return await result
    except ClientError as exc:
        if exc.status == Status.NotMyVbucket:
            return None
        raise

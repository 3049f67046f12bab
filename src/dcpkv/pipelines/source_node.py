"""The node a pipeline reads: its connection settings, and what the pipelines ask it.

:class:`SourceSettings` says where the changes come from (the server, which of its vbuckets,
how many changes a trigger). The pipelines ask the node two questions beside the stream:
each vbucket's branch and high seqno now (:func:`server_seqnos`: lag, caught up), and the
seqno a failover cannot take away from a branch (:func:`persisted_seqnos`, from ObserveSeqno
on the active and its replicas; :func:`safe_seqno` is its rule): a table's retention floor.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any

from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.core.durability import MutationToken, Observation
from dcpkv.core.tls import TlsSettings


@dataclass(frozen=True)
class SourceSettings:
    """Where the changes come from: the server (``connection``) and which of its changes."""

    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    vbuckets: str | None = None
    max_changes_per_trigger: int | None = None

    @classmethod
    def at(cls, port: int, **kw: Any) -> SourceSettings:
        """Every change of the default bucket on a local node."""
        return cls(ConnectionSettings.at(port=port), **kw)

    def options(self) -> dict[str, str]:
        opts = self.connection.spark_options()
        if self.vbuckets:
            opts["vbuckets"] = self.vbuckets
        if self.max_changes_per_trigger is not None:
            opts["maxChangesPerTrigger"] = str(self.max_changes_per_trigger)
        return opts

    def client_settings(self) -> ClientSettings:
        return ClientSettings(self.connection)

    # A view's definition records its source (``views``) in this flat JSON form.
    def to_json_obj(self) -> dict[str, Any]:
        c = self.connection
        # several seeds: "host" holds the connection string (ConnectionSettings.at reads it)
        host = c.host if len(c.nodes) == 1 else c.connection_string
        return {
            "host": host, "port": c.port, "bucket": c.bucket, "user": c.user,
            "password": c.password, "vbuckets": self.vbuckets,
            "max_changes_per_trigger": self.max_changes_per_trigger,
            "tls": asdict(c.tls) if c.tls is not None else None,
        }  # fmt: skip

    @classmethod
    def from_json_obj(cls, doc: dict[str, Any]) -> SourceSettings:
        connection = ConnectionSettings.at(
            doc["host"], doc["port"], bucket=doc["bucket"], user=doc["user"],
            password=doc["password"], tls=TlsSettings(**doc["tls"]) if doc.get("tls") else None,
        )  # fmt: skip
        return cls(connection, doc.get("vbuckets"), doc.get("max_changes_per_trigger"))


# -- the server's seqnos ----------------------------------------------------------------------


def server_seqnos(source: SourceSettings) -> dict[int, tuple[int, int]]:
    """vbucket -> (uuid, high seqno) now."""
    from dcpkv.client.cluster import ClusterKV

    async def ask() -> dict[int, tuple[int, int]]:
        session = await ClusterKV.open(source.client_settings())
        try:
            return await session.vbucket_seqnos()
        finally:
            await session.close()

    return asyncio.run(ask())


def persisted_seqnos(source: SourceSettings, uuids: dict[int, int]) -> dict[int, int]:
    """vbucket -> the seqno persisted on branch ``uuids[vb]`` by its active *and* its
    replicas (:func:`safe_seqno`); a vbucket whose branch moved since is left out (its floor
    stays where it was)."""
    from dcpkv.client.cluster import ClusterKV

    async def ask() -> dict[int, int]:
        session = await ClusterKV.open(source.client_settings())
        try:
            found = await asyncio.gather(
                *(_observed(session, MutationToken(vb, u, 0)) for vb, u in uuids.items())
            )
        finally:
            await session.close()
        return {
            vb: safe for vb, obs in zip(uuids, found, strict=True)
            if (safe := safe_seqno(obs)) is not None
        }  # fmt: skip

    return asyncio.run(ask())


async def _observed(session: Any, token: MutationToken) -> list[Observation]:
    """ObserveSeqno of the token's branch on its active (first) and on each replica that
    answers (a replica down cannot be promoted while it is down)."""
    from dcpkv.client.cluster import NODE_ERRORS
    from dcpkv.client.connection import ClientError
    from dcpkv.protocol import kv

    answer = await session.call(
        token.vbucket, kv.ObserveSeqno(vbucket=token.vbucket, vbucket_uuid=token.vbucket_uuid)
    )
    if not isinstance(answer, kv.ObserveSeqnoResponse) or answer.failed_over:
        return []
    found = [Observation(True, answer.last_persisted_seqno, answer.current_seqno)]
    for node in session.router.replicas(token.vbucket):
        with contextlib.suppress(ClientError, *NODE_ERRORS):
            found.append(await session.observe(node, token, active=False))
    return found


def safe_seqno(found: list[Observation]) -> int | None:
    """The highest seqno a failover cannot take away from the branch, as far as is known: the
    lowest persisted seqno of the active (first) and its replicas. A failover promotes a
    replica at what *it* persisted, usually below the active's figure, so a floor from the
    active alone made most rollbacks after a failover land below it and resync the vbucket
    (a Spark job each: minutes of lag in the chaos demo). A replica that does not know the
    branch (being rebuilt) or whose branch ended (it was promoted and demoted since) gives
    0 or its branch end. None: the active did not answer on this branch.

    ===================================================  ==================================
    found                                                safe
    ===================================================  ==================================
    []                                                   None (branch moved, or no answer)
    active persisted 40                                  40
    active 40, replica persisted 33                      33
    active 40, replica 45 (flushed further)              40
    active 40, replica not knowing the branch            0
    active 40, replica 50 whose branch ended at 30       30
    ===================================================  ==================================
    """
    if not found:
        return None
    safe = found[0].persisted
    for obs in found[1:]:
        if not obs.known:
            return 0
        safe = min(safe, obs.persisted, obs.branch_end if obs.branch_end is not None else safe)
    return safe

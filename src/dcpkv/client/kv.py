"""A tiny asyncio key-value session: the reads a DCP client needs next to its stream.

Theory of operation
-------------------
One authenticated :class:`~dcpkv.client.connection.Connection` with the bucket selected;
requests are pipelined freely (answers are matched by opaque). It serves the questions a DCP
consumer asks outside the stream: every vbucket's uuid and high seqno (Stat
``vbucket-seqno``), which vbuckets the node holds active (GetAllVbSeqnos with the active
state), a vbucket's failover log (GetFailoverLog needs no DCP connection), and
the current document of a key (Get), for the mutation-log repair after a rollback.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from dcpkv.client.connection import ClientError, Connection, authenticate
from dcpkv.client.settings import ClientSettings
from dcpkv.core.deadline import within
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.status import Status, status_name
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol import dcp, kv


@dataclass(frozen=True, slots=True)
class Document:
    """A Get hit. Get does not return the document's seqno."""

    key: bytes
    value: bytes
    flags: int
    cas: int
    datatype: int


class KVSession:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @classmethod
    async def open(cls, config: ClientSettings, host: str | None = None, port: int | None = None):
        c = config.connection
        conn = await Connection.open(host or c.host, port or c.port, config.connect_timeout, c.tls)
        try:
            await within(
                authenticate(conn, c.user, c.password, c.bucket),
                config.connect_timeout,
            )
        except BaseException:
            await conn.close()
            raise
        return cls(conn)

    @property
    def alive(self) -> bool:
        return self.conn.error is None

    async def close(self) -> None:
        await self.conn.close()

    async def vbucket_seqnos(self, vbucket: int | None = None) -> dict[int, tuple[int, int]]:
        """vbucket -> (vbucket uuid, high seqno), for one vbucket or all of them."""
        rows = await self.conn.stats("vbucket-seqno" + ("" if vbucket is None else f" {vbucket}"))
        uuids: dict[int, int] = {}
        highs: dict[int, int] = {}
        for name, value in rows:
            vb_part, _, field = name.partition(":")
            if not vb_part.startswith("vb_") or field not in ("uuid", "high_seqno"):
                continue
            vb = int(vb_part[3:])
            (uuids if field == "uuid" else highs)[vb] = int(value)
        return {vb: (uuids.get(vb, 0), highs[vb]) for vb in sorted(highs)}

    async def active_vbuckets(self) -> set[int]:
        """The vbuckets this node holds active (GetAllVbSeqnos, state active)."""
        answer = await self.conn.call(kv.GetAllVbSeqnos(state=int(VBucketState.ACTIVE)))
        if not isinstance(answer, kv.GetAllVbSeqnosResponse):
            status = getattr(answer, "status", None)
            raise ClientError(f"GetAllVbSeqnos: {status_name(status or 0)}", status)
        return {vb for vb, _seqno in answer.seqnos}

    async def failover_log(self, vbucket: int) -> tuple[FailoverEntry, ...]:
        answer = await self.conn.call(dcp.GetFailoverLog(vbucket=vbucket))
        if not isinstance(answer, dcp.GetFailoverLogResponse):
            status = getattr(answer, "status", None)
            raise ClientError(f"GetFailoverLog vb {vbucket}: {status_name(status or 0)}", status)
        return tuple(answer.failover_log)

    async def get(self, vbucket: int, key: bytes) -> Document | None:
        """The current document, or None when the key does not exist."""
        answer = await self.conn.call(kv.Get(key=key, vbucket=vbucket))
        if isinstance(answer, kv.GetResponse):
            return Document(key, bytes(answer.value), answer.flags, answer.cas, answer.datatype)
        status = getattr(answer, "status", None)
        if status == Status.KeyEnoent:
            return None
        raise ClientError(f"Get vb {vbucket}: {status_name(status or 0)}", status)

    async def get_many(self, vbucket: int, keys: list[bytes]) -> list[Document | None]:
        """Pipelined Gets, answers in the order of ``keys``."""
        return list(await asyncio.gather(*(self.get(vbucket, k) for k in keys)))

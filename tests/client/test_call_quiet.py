"""Connection.call_quiet against a real server: quiet writes and a Noop, only the failures
answer, each under the opaque of its request."""

from __future__ import annotations

import asyncio

from dcpkv.client.cluster import ClusterKV
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.core.status import Status
from dcpkv.protocol import kv
from support.serverproc import ServerProcess

CAS = 0x1780_0000_0000_0000


def test_only_the_failures_answer_under_their_opaques(server: ServerProcess) -> None:
    async def go() -> None:
        config = ClientSettings(ConnectionSettings.at(port=server.port))
        async with await ClusterKV.open(config) as c:
            conn = (await c.session(c.router.nodes()[0])).conn
            keys = [b"q-a", b"q-b", b"q-a", b"q-c"]  # the second q-a is identical: refused
            opaques = [conn.next_opaque() for _ in keys]
            frames = b"".join(
                kv.SetqWithMeta(
                    vbucket=c.vbucket_of(key), key=key, value=b"v", rev_seqno=1, meta_cas=CAS,
                    opaque=opaque,
                ).encode()
                for key, opaque in zip(keys, opaques, strict=True)
            )  # fmt: skip
            failures = await conn.call_quiet(frames, opaques)
            assert {o: getattr(m, "status", None) for o, m in failures.items()} == {
                opaques[2]: Status.KeyEexists
            }
            for key in (b"q-a", b"q-b", b"q-c"):
                meta = await c.call(
                    c.vbucket_of(key), kv.GetMeta(key=key, vbucket=c.vbucket_of(key))
                )
                assert isinstance(meta, kv.GetMetaResponse) and meta.cas == CAS, key
            assert await conn.call_quiet(b"", []) == {}  # nothing sent: the Noop alone

    asyncio.run(go())

"""The consumer when a vbucket stops being active under it and comes back, on a real server:
the stream ends with StateChanged, the map names nobody for the vbucket meanwhile, the stream
resumes from the same offset once it is active again: no rollback, nothing missed, and the
other vbuckets' streams go on throughout."""

from __future__ import annotations

import asyncio
import struct

from dcpkv.client import events
from dcpkv.client.consumer import Consumer
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol.constants import Opcode, StreamEndReason
from support.clienthelp import Writer, vb_of
from support.kvclient import KVClient
from support.serverproc import ServerProcess


def set_state(port: int, vb: int, state: VBucketState) -> None:
    with KVClient(port) as kv:
        assert kv.login().status == Status.Success
        answer = kv.call(Opcode.SetVbucket, extras=struct.pack(">I", state), vbucket=vb)
        assert answer.status == Status.Success


def keys_in(vb: int, count: int, prefix: str) -> list[bytes]:
    out = []
    i = 0
    while len(out) < count:
        key = f"{prefix}{i}".encode()
        if vb_of(key) == vb:
            out.append(key)
        i += 1
    return out


def test_a_vbucket_that_leaves_and_returns_resumes_from_its_offset(
    server: ServerProcess,
) -> None:
    moving, steady = 3, 5
    config = ClientSettings(
        ConnectionSettings.at(port=server.port), max_backoff=0.2, noop_interval=1.0
    )
    writer = Writer(server.port)

    async def scenario() -> tuple[list[events.Event], dict[str, int]]:
        seen: list[events.Event] = []
        consumer = Consumer(config)

        async def follow() -> None:
            async for ev in consumer.stream([moving, steady], start="beginning", end="forever"):
                seen.append(ev)

        async def got(keys: list[bytes]) -> None:
            for _ in range(600):
                have = {e.key for e in seen if isinstance(e, events.Mutation)}
                if set(keys) <= have:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"never received {sorted(set(keys) - have)[:3]}")

        task = asyncio.create_task(follow())
        first = keys_in(moving, 5, "a") + keys_in(steady, 5, "a")
        for key in first:
            writer.set(key, b"1")
        await got(first)
        set_state(server.port, moving, VBucketState.REPLICA)
        during = keys_in(steady, 5, "b")  # the other vbucket streams on meanwhile
        for key in during:
            writer.set(key, b"2")
        await got(during)
        set_state(server.port, moving, VBucketState.ACTIVE)
        after = keys_in(moving, 5, "c")
        for key in after:
            writer.set(key, b"3")
        await got(after)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await consumer.close()
        return seen, consumer.counters

    try:
        seen, counters = asyncio.run(scenario())
    finally:
        writer.close()
    ends = [e for e in seen if isinstance(e, events.StreamEnd)]
    assert [(e.vbucket, e.reason, e.will_resume) for e in ends] == [
        (moving, StreamEndReason.StateChanged, True)
    ]
    assert counters["rollbacks"] == 0
    mutations = [e for e in seen if isinstance(e, events.Mutation) and e.vbucket == moving]
    seqnos = [e.seqno for e in mutations]
    assert seqnos == sorted(set(seqnos))  # nothing twice, in order: resumed from the offset
    assert len(mutations) == 10

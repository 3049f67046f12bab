"""Durable writes as the DCP client library sees them, against a real server: with
``ClientSettings(include_prepares=True)`` their prepares, commits and aborts arrive as events of
their own; by default (and as the Spark source and the pipelines' node source configure it)
only committed changes arrive, a commit as the Mutation it made, never a prepare."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest

from dcpkv.client import events
from dcpkv.client.consumer import Consumer
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.spark.options import parse_options
from support.rawclient import RawClient
from support.serverproc import ServerProcess

SET, SET_VBUCKET = 0x01, 0x3D
SUCCESS, AMBIGUOUS = 0x00, 0xA3
ALT_REQUEST, SYNC_REPLICATION = 0x10, 0x11
SET_EXTRAS = struct.pack(">II", 0, 0)
ALONE_VB, WAITING_VB = 3, 5  # a chain of this node alone; one with a replica that never acks


def durability(level: int, timeout_ms: int | None = None) -> bytes:
    if timeout_ms is None:
        return bytes((0x11, level))
    return bytes((0x13, level)) + struct.pack(">H", timeout_ms)


@pytest.fixture
def written(server: ServerProcess) -> ServerProcess:
    """vb 3: a (plain), c (durable: prepare, commit); vb 5: p (durable, aborted: no ack)."""
    raw = RawClient(server.port)
    try:
        assert SYNC_REPLICATION in raw.hello(ALT_REQUEST, SYNC_REPLICATION)
        raw.login()
        me = f"127.0.0.1:{server.port}"
        for vb, chain in ((ALONE_VB, [me]), (WAITING_VB, [me, "replica1"])):
            value = json.dumps({"topology": [chain]}).encode()
            answer = raw.call(SET_VBUCKET, value=value, extras=b"\x01", vbucket=vb)
            assert answer.status == SUCCESS, answer
        assert raw.call(SET, b"a", b"1", SET_EXTRAS, vbucket=ALONE_VB).status == SUCCESS
        answer = raw.call(SET, b"c", b"2", SET_EXTRAS, vbucket=ALONE_VB, framing=durability(1))
        assert answer.status == SUCCESS, answer
        answer = raw.call(
            SET, b"p", b"3", SET_EXTRAS, vbucket=WAITING_VB, framing=durability(1, 100)
        )
        assert answer.status == AMBIGUOUS, answer
    finally:
        raw.close()
    return server


def received(config: ClientSettings) -> list[tuple[object, ...]]:
    """(event, vbucket, key, seqno) of every change of vbuckets 3 and 5, up to now."""

    async def main() -> list[events.Event]:
        async with Consumer(config) as consumer:
            return [ev async for ev in consumer.stream([ALONE_VB, WAITING_VB], end="now")]

    out: list[tuple[object, ...]] = []
    for ev in asyncio.run(main()):
        if isinstance(ev, events.Mutation | events.Prepare | events.Commit | events.Abort):
            out.append((type(ev).__name__, ev.vbucket, ev.key, ev.seqno))
    return out


def test_include_prepares_brings_prepares_commits_and_aborts(written: ServerProcess) -> None:
    config = ClientSettings(
        ConnectionSettings.at(port=written.port), name="prepares", include_prepares=True
    )
    assert sorted(received(config), key=lambda e: (e[1], e[3])) == [
        ("Mutation", ALONE_VB, b"a", 1),
        ("Prepare", ALONE_VB, b"c", 2),
        ("Commit", ALONE_VB, b"c", 3),
        ("Prepare", WAITING_VB, b"p", 1),
        ("Abort", WAITING_VB, b"p", 2),
    ]


COMMITTED_ONLY = [("Mutation", ALONE_VB, b"a", 1), ("Mutation", ALONE_VB, b"c", 3)]


def test_by_default_and_for_spark_and_the_pipelines_committed_changes_only(
    written: ServerProcess,
) -> None:
    at = ConnectionSettings.at(port=written.port)
    spark = parse_options({"host": "127.0.0.1", "port": str(written.port)}).client_settings()
    for config in (ClientSettings(at, name="plain"), spark, SourceSettings(at).client_settings()):
        assert not config.include_prepares
        assert sorted(received(config), key=lambda e: (e[1], e[3])) == COMMITTED_ONLY

"""The asyncio Consumer and its sync facade against a real server subprocess.

Each test drives writes with a blocking KV client, pulls events from the consumer until every
vbucket's offset stands at the server's high seqno on the server's branch (bounded by an
event count, with a generous per-event safety timeout), and compares what the application
built from the events with KV Gets of every key.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

from dcpkv.client import events
from dcpkv.client.consumer import Consumer
from dcpkv.client.mutation_log import MutationLog
from dcpkv.client.offsets import Offsets
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.client.sync import SyncConsumer
from dcpkv.core.deadline import within
from support.clienthelp import VBUCKETS, Writer, vb_of
from support.serverproc import ServerProcess

EVENT_TIMEOUT_S = 60.0  # a safety net against hangs, never an assertion on speed
MAX_EVENTS = 200_000


def config(port: int, name: str = "test:client") -> ClientSettings:
    return ClientSettings(
        ConnectionSettings.at(port=port), name=name, noop_interval=1.0, max_backoff=0.5
    )


class App:
    """What an application builds from the events. With ``history`` it can roll back (it
    keeps every version by seqno); without, it relies on the mutation log's repair."""

    def __init__(self, *, history: bool = True) -> None:
        self.history = history
        self.versions: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
        self.docs: dict[int, dict[bytes, bytes]] = {}
        self.events: list[events.Event] = []

    def apply(self, ev: events.Event) -> None:
        self.events.append(ev)
        if isinstance(ev, events.Mutation):
            self._set(ev.vbucket, ev.seqno, ev.key, ev.value)
        elif isinstance(ev, events.Deletion | events.Expiration):
            self._set(ev.vbucket, ev.seqno, ev.key, None)
        elif isinstance(ev, events.Rollback):
            if self.history:
                self._roll_back(ev.vbucket, ev.rollback_seqno)
            elif ev.rollback_seqno == 0:
                self.docs[ev.vbucket] = {}

    def _set(self, vb: int, seqno: int, key: bytes, value: bytes | None) -> None:
        self.versions.setdefault(vb, []).append((seqno, key, value))
        docs = self.docs.setdefault(vb, {})
        if value is None:
            docs.pop(key, None)
        else:
            docs[key] = value

    def _roll_back(self, vb: int, seqno: int) -> None:
        kept = [v for v in self.versions.get(vb, []) if v[0] <= seqno]
        self.versions[vb], self.docs[vb] = [], {}
        for s, key, value in kept:
            self._set(vb, s, key, value)

    def all_docs(self) -> dict[bytes, bytes]:
        return {k: v for docs in self.docs.values() for k, v in docs.items()}


async def follow(
    it: AsyncIterator[events.Event],
    consumer: Consumer,
    app: App,
    target: dict[int, tuple[int, int]],
) -> None:
    """Pull events until every vbucket's offset is at ``target`` (uuid, high seqno)."""

    def done() -> bool:
        offsets = consumer.offsets
        return all(
            vb in offsets and (offsets[vb].vb_uuid, offsets[vb].seqno) == want
            for vb, want in target.items()
        )

    for _ in range(MAX_EVENTS):
        if done():
            return
        app.apply(await within(anext(it), EVENT_TIMEOUT_S))
    raise AssertionError("never caught up")


def test_follows_writes_deletes_and_expiries(server: ServerProcess) -> None:
    w = Writer(server.port)
    keys = {f"doc{i}".encode() for i in range(300)}
    ttl_keys = {f"ttl{i}".encode() for i in range(20)}
    for key in sorted(keys):
        w.set(key, b"v1-" + key)
    for key in sorted(keys)[::7]:
        w.delete(key)

    async def main() -> App:
        app = App()
        async with Consumer(config(server.port)) as consumer:
            it = consumer.stream()
            await follow(it, consumer, app, await consumer.vbucket_seqnos())
            for key in sorted(ttl_keys):
                w.set(key, b"short-lived", expiry=1)
            for key in sorted(keys)[::5]:
                w.set(key, b"v2-" + key)
            for _ in range(100):  # bounded wait for the TTLs; a Get queues the expiration
                if not w.docs(ttl_keys):
                    break
                await asyncio.sleep(0.05)
            await follow(it, consumer, app, await consumer.vbucket_seqnos())
            await it.aclose()
        return app

    app = asyncio.run(main())
    assert app.all_docs() == w.docs(keys | ttl_keys)
    expired = {ev.key for ev in app.events if isinstance(ev, events.Expiration)}
    assert expired == ttl_keys
    assert sum(isinstance(ev, events.StreamStart) for ev in app.events) == VBUCKETS
    w.close()


def _crash_scenario(
    server_factory: type[ServerProcess], tmp_path: Path, *, mutation_log: MutationLog | None
) -> tuple[App, Consumer, dict[bytes, bytes]]:
    """First life persisted; second life in memory only, followed live; kill -9; restart on
    the same port; third-life writes. The consumer reconnects by itself throughout."""
    data, log = tmp_path / "crash", tmp_path / "crash.log"
    srv = server_factory(data, log)
    port = srv.start()
    keys = [f"key{i}".encode() for i in range(160)]
    w = Writer(port)
    for key in keys:
        w.set(key, b"persisted-" + key)
    w.close()
    assert srv.terminate() == 0
    srv = server_factory(data, log, "--flush-interval", "3600", "--port", str(port))
    srv.start()
    app = App(history=mutation_log is None)
    consumer = Consumer(config(port), mutation_log=mutation_log)

    async def main() -> None:
        it = consumer.stream()
        await follow(it, consumer, app, await consumer.vbucket_seqnos())
        w = Writer(port)
        for key in keys[::2]:
            w.delete(key)
        for key in keys[::3]:
            w.set(key, b"lost-" + key)
        w.close()
        await follow(it, consumer, app, await consumer.vbucket_seqnos())
        await asyncio.to_thread(srv.kill9)
        again = server_factory(data, log, "--port", str(port))
        await asyncio.to_thread(again.start)
        w = Writer(port)
        for key in keys[1::4]:
            w.set(key, b"third-life-" + key)
        w.close()
        await follow(it, consumer, app, await consumer.vbucket_seqnos())
        await it.aclose()
        await consumer.close()

    asyncio.run(main())
    w = Writer(port)
    server = w.docs(set(keys))
    w.close()
    return app, consumer, server


def test_rollback_after_unclean_restart_ends_equal(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    app, consumer, server = _crash_scenario(server_factory, tmp_path, mutation_log=None)
    assert app.all_docs() == server
    rollbacks = [ev for ev in app.events if isinstance(ev, events.Rollback)]
    assert rollbacks and consumer.counters["sessions"] >= 2
    assert all(ev.rollback_seqno <= ev.producer_seqno for ev in rollbacks)


def test_mutation_log_repairs_without_full_resync(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    with MutationLog(tmp_path / "mlog.sqlite3") as mlog:
        app, consumer, server = _crash_scenario(server_factory, tmp_path, mutation_log=mlog)
    assert app.all_docs() == server
    assert consumer.counters["full_resyncs"] == 0
    assert consumer.counters["repaired_keys"] > 0
    assert consumer.counters["rollbacks"] > 0
    assert not any(isinstance(ev, events.Rollback) and ev.rollback_seqno == 0 for ev in app.events)


def test_mutation_log_falls_back_to_full_resync_when_too_small(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    with MutationLog(tmp_path / "mlog.sqlite3", capacity=1) as mlog:
        app, consumer, server = _crash_scenario(server_factory, tmp_path, mutation_log=mlog)
    assert app.all_docs() == server
    assert consumer.counters["full_resyncs"] > 0


def test_sync_facade_ends_now_explicit_and_resumes(server: ServerProcess) -> None:
    w = Writer(server.port)
    keys = {f"s{i}".encode() for i in range(200)}
    for key in sorted(keys):
        w.set(key, key * 2)
    with SyncConsumer(config(server.port, "test:sync")) as sync:
        seqnos = sync.vbucket_seqnos()
        assert set(seqnos) == set(range(VBUCKETS))
        assert sync.failover_log(3)[0].uuid == seqnos[3][0]
        got = [ev for ev in sync.stream(end="now") if isinstance(ev, events.Mutation)]
        assert {ev.key: ev.value for ev in got} == w.docs(keys)
        saved = Offsets.from_json(sync.offsets.to_json())
    for key in sorted(keys)[:10]:
        w.set(key, b"new")
    with SyncConsumer(config(server.port, "test:sync")) as sync:
        ends = {vb: high for vb, (_u, high) in sync.vbucket_seqnos().items()}
        it = sync.stream(start=saved, end=ends)
        again = [ev for ev in it if isinstance(ev, events.Mutation)]
        assert sorted(ev.key for ev in again) == sorted(keys)[:10]
        assert all(sync.offsets[vb].seqno == ends[vb] for vb in ends)
        # start="now" on a fresh consumer: nothing old; then resume past a new write
        vb1 = vb_of(b"s1")
        with SyncConsumer(config(server.port, "test:sync2")) as fresh:
            evs = list(fresh.stream([vb1], start="now", end="now"))
            assert not any(isinstance(ev, events.Mutation) for ev in evs)
            w.set(b"s1", b"newest")
            high = fresh.vbucket_seqnos()[vb1][1]
            items = [
                ev for ev in fresh.stream([vb1], end={vb1: high}) if isinstance(ev, events.Mutation)
            ]
            assert [(ev.key, ev.value) for ev in items] == [(b"s1", b"newest")]
    w.close()


def test_dead_connection_is_noticed_and_resumed(server: ServerProcess) -> None:
    """A producer that stops talking (SIGSTOP) is declared dead after two noop intervals; the
    consumer reconnects once it is back and carries on from its offsets."""
    import os
    import signal

    w = Writer(server.port)
    for i in range(50):
        w.set(b"a%d" % i, b"1")

    async def main() -> Consumer:
        app = App()
        consumer = Consumer(
            ClientSettings(
                ConnectionSettings.at(port=server.port), noop_interval=0.2, max_backoff=0.2
            )
        )
        it = consumer.stream()
        await follow(it, consumer, app, await consumer.vbucket_seqnos())
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(1.0)  # > two noop intervals: the session is declared dead
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        w.set(b"after", b"2")
        await follow(it, consumer, app, await consumer.vbucket_seqnos())
        await it.aclose()
        await consumer.close()
        assert app.all_docs()[b"after"] == b"2"
        return consumer

    started = time.monotonic()
    consumer = asyncio.run(main())
    assert consumer.counters["sessions"] >= 2, time.monotonic() - started
    w.close()


def test_include_values_false_streams_keys_without_values(server: ServerProcess) -> None:
    w = Writer(server.port)
    keys = {f"nv{i}".encode() for i in range(50)}
    for key in sorted(keys):
        w.set(key, key * 3)
    cfg = ClientSettings(
        ConnectionSettings.at(port=server.port), name="test:novalue", include_values=False
    )
    with SyncConsumer(cfg) as sync:
        got = [ev for ev in sync.stream(end="now") if isinstance(ev, events.Mutation)]
    assert {ev.key for ev in got} == keys
    assert all(ev.value == b"" and ev.datatype == 0 for ev in got)


def _pump_reads_ahead(sync: SyncConsumer, limit_s: float = 10.0) -> bool:
    """Whether the pump's private offsets get ahead of the handed-out ones on some vbucket."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if any(sync.consumer.offsets[vb].seqno > sync.offsets[vb].seqno for vb in range(VBUCKETS)):
            return True
        time.sleep(0.005)
    return False


def test_sync_facade_offsets_move_one_event_at_a_time_despite_chunks(
    server: ServerProcess,
) -> None:
    w = Writer(server.port)
    for i in range(300):
        w.set(f"c{i}".encode(), b"x" * (i % 7))
    with SyncConsumer(config(server.port, "test:chunks"), chunk_events=16) as sync:
        seen: dict[int, object] = {}
        ran_ahead = False
        for ev in sync.stream(end="now"):
            # Handed over: the public offsets are exactly as of this event, for every vbucket.
            seen[ev.vbucket] = ev.offset
            assert {vb: sync.offsets[vb] for vb in seen} == seen
            if not ran_ahead:
                # The pump thread reads ahead while the caller holds an event; wait for it
                # (bounded) rather than hope it already has: its pace is the machine's.
                ran_ahead = _pump_reads_ahead(sync)
        assert ran_ahead, "the pump should have read ahead of the caller"
        saved = Offsets.from_json(sync.offsets.to_json())
    w.set(b"c1", b"after")
    with SyncConsumer(config(server.port, "test:chunks")) as sync:
        ends = {vb: high for vb, (_u, high) in sync.vbucket_seqnos().items()}
        again = [e for e in sync.stream(start=saved, end=ends) if isinstance(e, events.Mutation)]
    assert [(e.key, e.value) for e in again] == [(b"c1", b"after")]


def test_sync_facade_closed_early_resumes_after_the_last_handed_event(
    server: ServerProcess,
) -> None:
    w = Writer(server.port)
    for i in range(400):
        w.set(f"e{i}".encode(), b"v")
    with SyncConsumer(config(server.port, "test:early"), chunk_events=64) as sync:
        it = sync.stream(end="now")
        first = [next(it) for _ in range(50)]
        it.close()  # the pump had read further; those events were never handed over
        keys = {e.key for e in first if isinstance(e, events.Mutation)}
        keys |= {e.key for e in sync.stream(end="now") if isinstance(e, events.Mutation)}
    assert keys == {f"e{i}".encode() for i in range(400)}

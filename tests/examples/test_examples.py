"""The scripts of ``examples/``, each run as a user runs it (its own process, its command line)
against a real ``dcpkv server`` subprocess on a free port, its output and its effect on the
bucket checked: resumes after a restart of the script, the mirror through a real rollback
(a kill -9 of the server with writes not yet on disk), a durable write through a kill -9."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from examplehelp import RunningExample, run_example

from support.kvclient import Writer
from support.serverproc import ServerProcess


def changes(stdout: str) -> set[tuple[str, str]]:
    """(kind, key) of every change line ``stream_changes.py`` printed."""
    return set(
        re.findall(r"^(mutation|deletion|expiration) vb=\d+ seqno=\d+ key=(\S+)", stdout, re.M)
    )


def test_stream_changes_prints_each_change_once_across_restarts(
    server: ServerProcess, tmp_path: Path
) -> None:
    with Writer(server.port) as bucket:
        for i in range(20):
            bucket.set(f"s{i}".encode(), b'{"n": %d}' % i)
    first = run_example("stream_changes.py", server.port, "--until-now", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert changes(first.stdout) == {("mutation", f"s{i}") for i in range(20)}
    assert 'key=s7 {"n": 7}' in first.stdout
    assert (tmp_path / "stream.offsets.json").exists()

    with Writer(server.port) as bucket:
        bucket.set(b"s0", b"changed")
        bucket.delete(b"s1")
        bucket.set(b"s20", b"new")
    again = run_example("stream_changes.py", server.port, "--until-now", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert changes(again.stdout) == {("mutation", "s0"), ("deletion", "s1"), ("mutation", "s20")}

    # Following (no --until-now) until Ctrl-C: the offsets are saved on the way out.
    follower = RunningExample("stream_changes.py", server.port, cwd=tmp_path)
    try:
        with Writer(server.port) as bucket:
            bucket.set(b"s21", b"live")
        assert changes("\n".join(follower.wait_for("key=s21"))) == {("mutation", "s21")}
        code, stderr = follower.interrupt()
    finally:
        follower.stop()
    assert code == 0, stderr
    last = run_example("stream_changes.py", server.port, "--until-now", cwd=tmp_path)
    assert last.returncode == 0, last.stderr
    assert changes(last.stdout) == set()


def mirror_docs(db: Path) -> dict[bytes, bytes]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT key, value FROM docs").fetchall())


def test_mirror_sqlite_rolls_back_what_a_crashed_server_lost(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    data, log, db = tmp_path / "data", tmp_path / "server.log", tmp_path / "mirror.sqlite3"
    keys = {f"m{i}".encode() for i in range(40)} | {f"lost{i}".encode() for i in range(5)}
    srv = server_factory(data, log)
    srv.start()
    with Writer(srv.port) as bucket:
        for i in range(40):
            bucket.set(f"m{i}".encode(), b"persisted")
    assert srv.terminate() == 0  # a clean stop: all of it on disk
    persisted = {f"m{i}".encode(): b"persisted" for i in range(40)}

    # Second life: the flusher held back, so these writes are in memory only.
    srv = server_factory(data, log, "--flush-interval", "3600")
    srv.start()
    with Writer(srv.port) as bucket:
        for i in range(0, 40, 3):
            bucket.delete(f"m{i}".encode())
        for i in range(1, 40, 4):
            bucket.set(f"m{i}".encode(), b"in memory only")
        for i in range(5):
            bucket.set(f"lost{i}".encode(), b"in memory only")
        in_memory = bucket.docs(keys)
    run = run_example("mirror_sqlite.py", srv.port, str(db), "--until-now", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "rollback" not in run.stdout
    assert mirror_docs(db) == in_memory != persisted

    srv.kill9()  # the in-memory writes are gone: the vbuckets start a new branch
    srv = server_factory(data, log)
    srv.start()
    with Writer(srv.port) as bucket:
        assert bucket.docs(keys) == persisted
    run = run_example("mirror_sqlite.py", srv.port, str(db), "--until-now", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^rollback vb=\d+ to seqno=\d+$", run.stdout, re.M), run.stdout
    assert mirror_docs(db) == persisted

    # A restart of the script resumes after what it committed: only the new changes.
    with Writer(srv.port) as bucket:
        bucket.set(b"m1", b"third life")
        bucket.delete(b"m2")
        now = bucket.docs(keys)
    run = run_example("mirror_sqlite.py", srv.port, str(db), "--until-now", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-2:] == [
        "2 changes applied",
        f"the mirror holds {len(now)} documents",
    ]
    assert mirror_docs(db) == now


def test_mirror_sqlite_follows_until_ctrl_c(server: ServerProcess, tmp_path: Path) -> None:
    db = tmp_path / "mirror.sqlite3"
    follower = RunningExample("mirror_sqlite.py", server.port, str(db), cwd=tmp_path)
    try:
        with Writer(server.port) as bucket:
            for i in range(10):
                bucket.set(f"f{i}".encode(), b"live")
        follower.wait_for("10 changes applied")  # committed, with the offsets after them
        code, stderr = follower.interrupt()
    finally:
        follower.stop()
    assert code == 0, stderr
    assert mirror_docs(db) == {f"f{i}".encode(): b"live" for i in range(10)}
    run = run_example("mirror_sqlite.py", server.port, str(db), "--until-now", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["the mirror holds 10 documents"]  # nothing new


def test_durable_write_survives_a_kill9(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    data, log = tmp_path / "data", tmp_path / "server.log"
    # A flush every 2 s: a write acknowledged from memory alone would not survive the kill.
    srv = server_factory(data, log, "--flush-interval", "2")
    srv.start()
    run = run_example("durable_write.py", srv.port, "order::1", '{"total": 12}', cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("order::1 persisted on 1 node(s), on 0 replica(s): vbucket ")
    srv.kill9()

    srv = server_factory(data, log)
    srv.start()
    with Writer(srv.port) as bucket:
        assert bucket.docs({b"order::1"}) == {b"order::1": b'{"total": 12}'}
    refused = run_example(
        "durable_write.py", srv.port, "order::2", "{}", "--replicate-to", "1", cwd=tmp_path
    )
    assert refused.returncode == 2
    assert "not written: replicate_to=1 but the vbucket has 0 replica(s)" in refused.stderr
    with Writer(srv.port) as bucket:
        assert bucket.docs({b"order::2"}) == {}


def test_sdk_documents(server: ServerProcess, tmp_path: Path) -> None:
    run = run_example("sdk_documents.py", server.port, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "get: {'name': 'Ada', 'country': 'France', 'orders': 0}",
        "orders after mutate_in: 1",
        "replace with a stale CAS: refused",
        "customer::1 removed: True",
    ]

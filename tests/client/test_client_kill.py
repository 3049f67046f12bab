"""Exactly-once resume: a consumer process SIGKILLed at random points during concurrent writes.

The applier (``sqlite_applier.py``) commits its documents and its offsets in one SQLite
transaction. It is killed a bounded number of times at random moments while a writer thread
sets and deletes keys, restarted from its saved state each time, and finally run to the
server's high seqnos (``end="now"``): its table must then equal the server's live documents.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.clienthelp import Writer
from support.serverproc import ServerProcess

APPLIER = Path(__file__).with_name("sqlite_applier.py")
KILLS = 6
KEYS = [f"k{i}".encode() for i in range(400)]


def _writer(port: int, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    w = Writer(port)
    for n in range(100_000):  # bounded; normally stopped long before
        if stop.is_set():
            break
        key = rng.choice(KEYS)
        if rng.random() < 0.2:
            w.delete(key)
        else:
            w.set(key, b"v%d-" % n + key)
        time.sleep(0.0005)
    w.close()


def _spawn(port: int, db: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(APPLIER), str(port), str(db), *extra],
        env=env,
        stderr=subprocess.PIPE,
    )


def test_killed_consumer_resumes_exactly_once(server: ServerProcess, tmp_path: Path) -> None:
    rng = random.Random(1234)
    db = tmp_path / "applied.sqlite3"
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(server.port, stop, 99))
    writer.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(KILLS):
            proc = _spawn(server.port, db)
            procs.append(proc)
            time.sleep(rng.uniform(0.3, 1.2))
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        stop.set()
        writer.join(timeout=60)
        final = _spawn(server.port, db, "--until-now")
        procs.append(final)
        _, err = final.communicate(timeout=120)
        assert final.returncode == 0, err.decode()
    finally:
        stop.set()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    conn = sqlite3.connect(db)
    applied = {bytes(k): bytes(v) for k, v in conn.execute("SELECT key, value FROM docs")}
    conn.close()
    w = Writer(server.port)
    live = w.docs(set(KEYS))
    w.close()
    assert applied == live
    assert len(live) > 100

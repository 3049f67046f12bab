"""Data folders the SQLite storage engine really wrote (``tests/fixtures/sqlite/``): where the
migration's tests start from, and how they were made.

The SQLite engine is gone from the server; only a read-only reader of its files is left, for the
conversion to RocksDB (``dcpkv.engine.sqlite_reader``). To keep that reader honest, its tests
read files the old engine itself wrote, not files written here in its image. Regenerate them
(from the repository's root, with a commit that still has the SQLite engine, such as
``a41cd74``, the last one) with::

    .venv/bin/python tests/support/sqlite_fixtures.py a41cd74

which adds a detached worktree of that commit (``git worktree add --detach``), runs this file's
writers (:func:`write_storage`, :func:`write_server`) in a fresh interpreter with that commit's
``src`` first on the path, and removes the worktree. The writers use the old commit's API
(``open_storage("sqlite", ...)``, ``Bucket(storage="sqlite")``). Each folder also gets
``expected.json``: what the old engine read back from what it wrote (:func:`snapshot`,
:func:`plain`), which the tests compare the converted bucket with.

``storage/``
    bucket ``b``, written through the storage seam: vbuckets 0 (replica) and 3 (active), six
    flushes each of updates (history for rollback), tombstones, an expiry, a pending prepare
    and a committed one (vbucket 3 also an aborted one), a compaction (purge seqno), an unclean
    shutdown, history window 1000. ``expected.json``: the snapshot, the versions it holds, and
    vbucket 0 after rollbacks to 29, 17 and 12 in turn.
``crashed/``
    the same files copied before the engine closed them, as a kill -9 leaves them: the
    database, its write-ahead log (every flush is still in it) and its ``-shm``.
``server/``
    bucket ``default`` (16 vbuckets, all active, as ``dcpkv server --vbuckets 16`` makes it)
    written through a ``Bucket``: 120 keys set three times, one flush a round, every 7th
    deleted, a clean shutdown. ``expected.json``: the live documents, and per vbucket its
    uuid and high seqno (where a DCP consumer that had read everything would resume).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sqlite"
STORAGE = FIXTURES / "storage"
SERVER = FIXTURES / "server"
WINDOW = 1000  # the storage fixture's history window
ROLLBACKS = (29, 17, 12)  # vbucket 0 of the storage fixture, in turn
SERVER_VBUCKETS = 16
SERVER_KEYS = [b"doc-%d" % i for i in range(120)]
SERVER_DELETED = set(SERVER_KEYS[::7])


def plain(value: Any) -> Any:
    """``value`` as JSON values: a dataclass as its class name and fields, bytes as
    ``{"hex": ...}``, a dict as [key, value] pairs, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"class": type(value).__name__, **fields}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"hex": bytes(value).hex()}
    if isinstance(value, dict):
        return [[plain(k), plain(v)] for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def vbucket_snapshot(storage: Any, vb: int) -> dict[str, Any]:
    """What a start, a backfill, a SyncWrite consumer's backfill and a rollback read of a
    vbucket (any engine's storage: the seam's methods only)."""
    scan = storage.open_stream_backfill(vb, 0, prepares=True)
    sync = list(scan.prepares)
    scan.close()
    return {
        "state": storage.vbucket_state(vb),
        "rows": rows(storage, vb),
        "sync_prepares": sync,
        "live": list(storage.load_items(vb)),
        "prepares": storage.load_prepares(vb),
        "points": storage.flush_points(vb),
        "history": sorted(storage.history(vb)),
        "get": [storage.get(vb, b"k%d" % k) for k in range(7)],
    }


def rows(storage: Any, vb: int) -> list[Any]:
    """A vbucket's backfill rows, as plain rows (``storage.row_of_stream_row``)."""
    from dcpkv.engine.storage import row_of_stream_row

    return [row_of_stream_row(r) for r in storage.open_stream_backfill(vb, 0).read(100_000)]


def snapshot(storage: Any) -> Any:
    """:func:`vbucket_snapshot` of each vbucket and the bucket's flags, as :func:`plain`."""
    states = storage.vbucket_states()
    return plain({
        "clean": storage.was_clean_shutdown(),
        "states": states,
        "vbuckets": {vb: vbucket_snapshot(storage, vb) for vb in sorted(states)},
    })  # fmt: skip


def rolled_back(storage: Any) -> Any:
    """Vbucket 0 after each rollback of :data:`ROLLBACKS` in turn: (point, rows)."""
    return plain([(storage.rollback(0, seqno), rows(storage, 0)) for seqno in ROLLBACKS])


def write_storage(folder: Path) -> None:  # (the old commit's API)
    """The ``storage/`` fixture (module docstring)."""
    from dcpkv.engine.bucket import open_storage
    from dcpkv.engine.item import AbortItem, CommitItem, Item, PrepareItem
    from dcpkv.engine.storage import VBState

    failover = '[{"id":7,"seq":5},{"id":3,"seq":0}]'
    storage = open_storage("sqlite", folder, "b", history_window=WINDOW, cache_bytes=0)
    for vb in (0, 3):
        seqno = 0
        for flush in range(6):
            items: list[Item] = []
            for k in range(5):
                seqno += 1
                key = b"k%d" % ((k + flush) % 7)
                deleted = (seqno % 4) == 0
                items.append(Item(key, b"" if deleted else b"v%d" % seqno, flags=k, expiry=seqno,
                                  cas=(1 << 63) + seqno, rev_seqno=flush + 1, by_seqno=seqno,
                                  datatype=flush % 2, deleted=deleted, delete_time=seqno,
                                  expired=deleted and k == 1))  # fmt: skip
            if flush == 4:
                seqno += 1
                items.append(PrepareItem(b"pending", b"p", by_seqno=seqno, cas=seqno, level=2))
                seqno += 1
                items.append(PrepareItem(b"done", b"d", by_seqno=seqno, cas=seqno, level=1))
                if vb == 3:
                    seqno += 1
                    items.append(PrepareItem(b"undone", b"u", by_seqno=seqno, cas=seqno, level=3))
            if flush == 5:
                seqno += 1
                items.append(CommitItem(b"done", b"d", by_seqno=seqno, cas=seqno))
                if vb == 3:
                    seqno += 1
                    items.append(AbortItem(b"undone", b"", by_seqno=seqno, cas=seqno,
                                           prepared_seqno=seqno - 3))  # fmt: skip
            state = VBState("active" if vb else "replica", failover, seqno, seqno, seqno,
                            max_cas=seqno)  # fmt: skip
            storage.persist([(vb, items, state)])
        storage.compact(vb, purge_before_seqno=5)
    storage.set_clean_shutdown(False)
    expected = {"versions": storage.count_versions(), "snapshot": snapshot(storage)}
    crashed = folder.parent / "crashed"  # the files as a kill -9 leaves them: a WAL beside
    crashed.mkdir()
    for path in folder.glob("b.sqlite3*"):
        shutil.copy(path, crashed / path.name)
    storage.close()
    scratch = Path(tempfile.mkdtemp())
    try:
        shutil.copy(folder / "b.sqlite3", scratch / "b.sqlite3")
        copy = open_storage("sqlite", scratch, "b", history_window=WINDOW, cache_bytes=0)
        expected["rollbacks"] = rolled_back(copy)
        copy.close()
    finally:
        shutil.rmtree(scratch)
    (folder / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


def write_server(folder: Path) -> None:  # (the old commit's API)
    """The ``server/`` fixture (module docstring)."""
    import random

    from dcpkv.core.vbucket import VBucketState, vbucket_for_key
    from dcpkv.engine.bucket import Bucket

    bucket = Bucket("default", folder, num_vbuckets=SERVER_VBUCKETS, rng=random.Random(1),
                    storage="sqlite")  # fmt: skip
    vbs = [bucket.set_vbucket_state(vb, VBucketState.ACTIVE) for vb in range(SERVER_VBUCKETS)]
    for round_ in range(3):  # several flushes: history and flush points to carry over
        for key in SERVER_KEYS:
            vbs[vbucket_for_key(key, SERVER_VBUCKETS)].set(key, b"%s-v%d" % (key, round_))
        bucket.flush_once()
    for key in sorted(SERVER_DELETED):
        vbs[vbucket_for_key(key, SERVER_VBUCKETS)].delete(key)
    bucket.flush_once()
    live = [key for key in SERVER_KEYS if key not in SERVER_DELETED]
    expected = {
        "docs": {key.decode(): f"{key.decode()}-v2" for key in live},
        "vbuckets": {vb.id: {"uuid": vb.failover.latest_uuid, "high_seqno": vb.high_seqno}
                     for vb in vbs},
    }  # fmt: skip
    bucket.shutdown()
    (folder / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


def _write(out: Path) -> None:
    """In the old commit's interpreter: both fixtures into ``out``."""
    import dcpkv

    source = os.environ["SQLITE_FIXTURE_SRC"]
    assert dcpkv.__file__.startswith(source), (dcpkv.__file__, source)  # the old commit's code
    for name, writer in (("storage", write_storage), ("server", write_server)):
        (out / name).mkdir(parents=True)
        writer(out / name)


def regenerate(commit: str) -> None:
    """Write both fixtures with ``commit``'s SQLite engine, over :data:`FIXTURES`."""
    repo = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "out"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), commit],
                       check=True)  # fmt: skip
        try:
            src = str(tree / "src")
            env = {**os.environ, "PYTHONPATH": src, "SQLITE_FIXTURE_SRC": src}
            subprocess.run([sys.executable, __file__, "--write", str(out)], env=env, check=True)
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                           check=True)  # fmt: skip
        for name in ("storage", "crashed", "server"):
            shutil.rmtree(FIXTURES / name, ignore_errors=True)
            shutil.copytree(out / name, FIXTURES / name)
            for extra in (FIXTURES / name).glob("*.lock"):
                extra.unlink()
    print(f"wrote {FIXTURES} with the SQLite engine of {commit}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        _write(Path(sys.argv[2]))
    else:
        regenerate(sys.argv[1])

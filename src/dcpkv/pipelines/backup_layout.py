"""The on-disk form of an incremental backup: runs, manifests, atomic commits, verification.

Theory of operation
-------------------
A backup folder holds one sub-folder per run under ``runs/``, numbered from ``000001``::

    DIR/runs/000001/manifest.json      what the run is (below); written last
    DIR/runs/000001/data/part-*.parquet the run's rows: the source's schema plus ``pos``
    DIR/runs/.tmp-000002-<pid>/         a run being written (or a crashed one): never trusted
    DIR/.lock                           held while a run is written

A run is committed by one rename: everything is written into a ``.tmp-`` folder, every file
and folder is fsynced, the manifest goes in last, and the folder is renamed to its number
(and ``runs/`` fsynced). A run folder without a manifest, or any ``.tmp-`` folder, is what a
crash leaves behind; :func:`committed_runs` ignores them and the next backup deletes them.

The manifest (``format`` 1) records, for the run: its number, start and finish time, the
bucket (name, vbucket count) and server; ``start`` and ``end``, the source offsets the run read
between (the Spark source's offset JSON, so ``end`` is the next run's ``startingOffsets``); per
vbucket the failover log at backup time, the changes by kind, the highest seqno read and the
rollbacks seen (``rollbacks``: "vbucket v rolled back to R"); totals; and every data file with
its size and SHA-256.

``pos`` orders the rows of a vbucket inside a run (a vbucket is read by one Spark task, in
stream order, and ``pos`` is Spark's monotonically increasing id of that task): a rollback row
drops the earlier changes of its vbucket above its seqno, in this run and the previous ones.

:func:`verify` needs no Spark: it checks the run numbers have no gap, every file against its
checksum (and the Parquet row counts against the manifest), the bucket is the same in every
run, and the chain of offsets per vbucket: run 1 starts at zero, run k starts where run k-1
ended, and a vbucket whose history branched below that point (the failover log of run k says
the producer must roll it back) has a rollback recorded in run k.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcpkv.core.errors import DcpkvError
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.files import fsync_dir, write_fully
from dcpkv.spark.plan import branch_moved, restart_point
from dcpkv.spark.sparkoffsets import SparkOffsetError, SparkOffsets

FORMAT = 1
RUNS = "runs"
DATA = "data"
MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
_RUN_NAME = re.compile(r"^\d{6}$")
_HASH_CHUNK = 1 << 20


class BackupError(DcpkvError):
    """A backup or restore that cannot go on (the message says why)."""


@dataclass(frozen=True)
class Run:
    """A committed run: its folder and parsed manifest."""

    number: int
    path: Path
    manifest: dict[str, Any]

    @property
    def start(self) -> SparkOffsets:
        return SparkOffsets.from_dict(self.manifest["start"])

    @property
    def end(self) -> SparkOffsets:
        return SparkOffsets.from_dict(self.manifest["end"])

    @property
    def data(self) -> Path:
        return self.path / DATA

    def vb(self, vbucket: int) -> dict[str, Any]:
        return self.manifest["vbuckets"].get(str(vbucket), {})


def run_name(number: int) -> str:
    return f"{number:06d}"


# -- reading --------------------------------------------------------------------------------


def committed_runs(root: Path) -> list[Run]:
    """Every committed run of ``root`` in number order (unreadable manifests raise)."""
    runs_dir = root / RUNS
    if not runs_dir.is_dir():
        return []
    out = []
    for path in sorted(runs_dir.iterdir()):
        if _RUN_NAME.match(path.name) and (path / MANIFEST).is_file():
            out.append(Run(int(path.name), path, load_manifest(path / MANIFEST)))
    return out


def incomplete_runs(root: Path) -> list[Path]:
    """What crashed runs left: ``.tmp-`` folders and run folders without a manifest."""
    runs_dir = root / RUNS
    if not runs_dir.is_dir():
        return []
    return sorted(p for p in runs_dir.iterdir() if _incomplete(p))


def _incomplete(path: Path) -> bool:
    if path.name.startswith(TMP_PREFIX):
        return True
    return bool(_RUN_NAME.match(path.name)) and not (path / MANIFEST).is_file()


def load_manifest(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BackupError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BackupError(f"{path}: not a dcpkv backup manifest of format {FORMAT}")
    return doc


# -- writing --------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold ``root/.lock``: one backup at a time per folder."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackupError(f"another backup is writing to {root}") from None
        yield
    finally:
        os.close(fd)


def new_temp_run(root: Path, number: int) -> Path:
    """A fresh ``.tmp-`` folder for run ``number``, after deleting what crashed runs left."""
    runs_dir = root / RUNS
    runs_dir.mkdir(parents=True, exist_ok=True)
    for leftover in incomplete_runs(root):
        shutil.rmtree(leftover)
    tmp = runs_dir / f"{TMP_PREFIX}{run_name(number)}-{os.getpid()}"
    tmp.mkdir()
    return tmp


def file_entries(folder: Path) -> list[dict[str, Any]]:
    """Every file under ``folder`` (relative path, size, SHA-256), fsynced on the way."""
    out = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        out.append(
            {
                "path": path.relative_to(folder).as_posix(),
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path, sync=True),
            }
        )
    return out


def sha256_file(path: Path, sync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
        if sync:
            os.fsync(f.fileno())
    return digest.hexdigest()


def commit_run(tmp: Path, manifest: dict[str, Any]) -> Path:
    """Write the manifest into ``tmp``, fsync, and rename it to its run number."""
    for folder in sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(folder)
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    fd = os.open(tmp / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_fully(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(tmp)
    final = tmp.parent / run_name(manifest["run"])
    if final.exists():
        raise BackupError(f"{final} already exists: another backup committed run {final.name}")
    os.rename(tmp, final)
    fsync_dir(tmp.parent)
    return final


# -- verification ---------------------------------------------------------------------------


def verify(root: Path) -> list[str]:
    """Every problem of the backup in ``root`` (empty: the chain is whole and intact)."""
    try:
        runs = committed_runs(root)
    except BackupError as exc:
        return [str(exc)]
    if not runs:
        return [f"{root}: no committed backup run"]
    problems = _numbering(runs) + _buckets(runs)
    for run in runs:
        problems += _files(run)
    problems += _chain(runs)
    return problems


def _numbering(runs: list[Run]) -> list[str]:
    out = []
    for expected, run in enumerate(runs, start=1):
        if run.number != expected:
            out.append(f"gap: run {run_name(expected)} is missing (next is {run.path.name})")
            break
    for run in runs:
        if run.manifest.get("run") != run.number:
            out.append(f"run {run.path.name}: its manifest says run {run.manifest.get('run')}")
    return out


def _buckets(runs: list[Run]) -> list[str]:
    first = runs[0].manifest.get("bucket")
    return [
        f"run {run.path.name}: bucket {run.manifest.get('bucket')} differs from run 1's {first}"
        for run in runs[1:]
        if run.manifest.get("bucket") != first
    ]


def _files(run: Run) -> list[str]:
    out = []
    listed = {e["path"]: e for e in run.manifest.get("files", [])}
    present = {p.relative_to(run.data).as_posix() for p in run.data.rglob("*") if p.is_file()}
    for rel in sorted(present - set(listed)):
        out.append(f"run {run.path.name}: unexpected file data/{rel}")
    rows = 0
    for rel, entry in sorted(listed.items()):
        path = run.data / rel
        if rel not in present:
            out.append(f"run {run.path.name}: missing file data/{rel}")
        elif path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            out.append(f"run {run.path.name}: checksum mismatch in data/{rel}")
        elif rel.endswith(".parquet"):
            rows += _parquet_rows(path)
    expected = run.manifest.get("totals", {}).get("rows")
    if not out and rows != expected:
        out.append(f"run {run.path.name}: {rows} rows in its files, manifest says {expected}")
    return out


def _parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def _chain(runs: list[Run]) -> list[str]:
    try:
        offsets = [(run.start, run.end) for run in runs]
    except (KeyError, SparkOffsetError) as exc:
        return [f"unreadable offsets in a manifest: {exc}"]
    out = []
    first_start = offsets[0][0]
    out += [
        f"run 000001: vbucket {vb} starts at seqno {pos.offset.seqno}, not zero"
        for vb, pos in first_start.items()
        if pos.offset.seqno != 0
    ]
    for i in range(1, len(runs)):
        out += _link(runs[i - 1], runs[i], offsets[i - 1][1], offsets[i][0])
    for run, (_start, end) in zip(runs, offsets, strict=True):
        out += _within(run, end)
    return out


def _link(prev: Run, run: Run, prev_end: SparkOffsets, start: SparkOffsets) -> list[str]:
    """Run ``run`` starts where ``prev`` ended, and records the rollback its history needs."""
    out = []
    for vb in sorted(set(prev_end) | set(start)):
        if prev_end.get(vb) != start.get(vb):
            out.append(
                f"gap: vbucket {vb}: run {run.path.name} starts at {_pos(start.get(vb))} but "
                f"run {prev.path.name} ended at {_pos(prev_end.get(vb))}"
            )
            continue
        out += _rollback_recorded(run, vb, start)
    return out


def _rollback_recorded(run: Run, vb: int, start: SparkOffsets) -> list[str]:
    info = run.vb(vb)
    pos = start[vb]
    log = tuple(FailoverEntry(e["id"], e["seq"]) for e in info.get("failover_log", []))
    end_pos = run.end.get(vb)
    if not log or end_pos is None or not branch_moved(pos, end_pos.offset.vb_uuid):
        return []
    needed = restart_point(pos, log, max(end_pos.offset.seqno, pos.offset.seqno))
    recorded = info.get("rollbacks", [])
    if needed < pos.offset.seqno and not any(r <= needed for r in recorded):
        return [
            f"vbucket {vb}: run {run.path.name} started on an abandoned branch above seqno "
            f"{needed} but records no rollback: the changes above it would be restored"
        ]
    return []


def _within(run: Run, end: SparkOffsets) -> list[str]:
    out = []
    for vb_key, info in run.manifest.get("vbuckets", {}).items():
        vb = int(vb_key)
        top = info.get("max_seqno", 0)
        if vb in end and top > end[vb].offset.seqno:
            out.append(
                f"run {run.path.name}: vbucket {vb} has seqno {top} past its end offset "
                f"{end[vb].offset.seqno}"
            )
    return out


def _pos(pos: Any) -> str:
    if pos is None:
        return "nothing"
    return f"seqno {pos.offset.seqno} of branch {pos.offset.vb_uuid}"

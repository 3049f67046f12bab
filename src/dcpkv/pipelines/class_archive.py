"""A class-data archive for Spark's driver JVM (AppCDS), so a job's Spark starts in half the time.

Theory of operation
-------------------
A fresh Spark driver JVM loads, verifies and links some 15,000 classes: the session's start
and its first jobs (the streaming engine, Parquet, Arrow, the Python runners) spent seconds
on it, every run of a command, on every query's first batch. HotSpot can map those classes
from an archive instead (Application Class-Data Sharing, JDK 13+): on this 2-core machine
the session's start went from 4.4-5.7 s to 2.5-2.7 s and a first Parquet job from 3.0-3.2 s
to 1.2-1.4 s.

The archive is made by the JVM itself: a run without one gets ``-XX:ArchiveClassesAtExit``
and writes, when it exits, every class it loaded (the run is slower by a few seconds, once).
Later runs get ``-XX:SharedArchiveFile``. It lives in the user's cache directory
(``$DCPKV_CACHE_DIR``, else ``$XDG_CACHE_HOME/dcpkv``, else ``~/.cache/dcpkv``), named by a
key of what it depends on (the Java binary, the PySpark version and its jars folder): another
JVM or Spark gets an archive of its own, and HotSpot itself refuses one whose class path
changed (it then runs without it, silently with ``-Xlog:cds=off``).

Only a whole archive may be used: HotSpot maps the file, and a truncated one crashes the JVM
(SIGBUS). So each run writes to a name of its own (``<key>.<pid>.tmp``), and a later start
adopts it (an atomic rename) only once its header is there: HotSpot writes the header last,
after every region, so the magic number at offset 0 means the file is complete. A file that
never got its header (the JVM was killed while writing) is deleted after
:data:`STALE_DUMP_S`. ``DCPKV_SPARK_CDS=0`` switches all of this off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from pathlib import Path

ARCHIVE_MAGIC = b"\xa8\xab\x0b\xf0"  # 0xf00baba8 little-endian: HotSpot's dynamic archive
STALE_DUMP_S = 600.0  # a dump without a header this old was interrupted: delete it
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def cache_dir() -> Path:
    if explicit := os.environ.get("DCPKV_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dcpkv"


def archive_key() -> str:
    """What the archive depends on: the Java binary Spark will run, PySpark and its jars."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java") or ""
    java = os.path.realpath(java) if java else ""
    jars = Path(pyspark.__file__).parent / "jars"
    parts = [java, str(_mtime(java)), pyspark.__version__, str(jars), str(_mtime(str(jars)))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _mtime(path: str) -> int:
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0


def is_complete(path: Path) -> bool:
    """Whether HotSpot finished writing the archive (its header, written last, is there)."""
    try:
        with path.open("rb") as f:
            return f.read(len(ARCHIVE_MAGIC)) == ARCHIVE_MAGIC
    except OSError:
        return False


def adopt_dumps(directory: Path, name: str, now: float) -> None:
    """Rename a finished dump of ``name`` into place; delete interrupted ones."""
    final = directory / name
    dumps = sorted(directory.glob(f"{name}.*.tmp"))
    finished = [d for d in dumps if is_complete(d)]
    if finished and not final.exists():
        with contextlib.suppress(OSError):
            os.replace(finished[0], final)
    for dump in dumps:
        with contextlib.suppress(OSError):  # adopted above, or deleted by another start
            if final.exists() or now - dump.stat().st_mtime > STALE_DUMP_S:
                dump.unlink()


def java_options() -> str:
    """The driver JVM's options: use the archive, or write it at exit ("" when switched off
    or the cache directory cannot be made)."""
    if os.environ.get("DCPKV_SPARK_CDS", "1") == "0":
        return ""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return ""
    name = f"spark-{archive_key()}.jsa"
    adopt_dumps(directory, name, time.time())
    final = directory / name
    if is_complete(final):
        return f"-XX:SharedArchiveFile={final} {QUIET}"
    return f"-XX:ArchiveClassesAtExit={directory / f'{name}.{os.getpid()}.tmp'} {QUIET}"

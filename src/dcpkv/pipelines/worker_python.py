"""The Python that a local Spark runs for its Python processes: this interpreter, importing
PySpark as installed (from its bytecode), not from the zip Spark puts first on their path.

Theory of operation
-------------------
For a Python data source Spark starts Python processes of its own: a daemon per kind of work
(the source's creation, the read's planning, the tasks), each forking its workers, and a
streaming source runner for every query. It puts ``$SPARK_HOME/python/lib/pyspark.zip`` and
py4j's zip first on their ``PYTHONPATH``, and a zip has no ``__pycache__``: each of those
processes compiled PySpark's modules from source, 0.4-0.5 s where the installed package
imports in 0.1 s (this 2-core machine). A cold query starts four or five of them one after
the other before its first tasks run, and every query starts a runner.

For a pip-installed PySpark, ``SPARK_HOME`` is the package's own folder and that zip holds
the very modules installed beside it. So :func:`worker_python` gives Spark
(``PYSPARK_PYTHON``) a small shell script that takes those two zips out of ``PYTHONPATH`` and
runs this interpreter: the processes import the installed PySpark (the same version, the same
files) from its bytecode cache. Every other entry of the path (the user's, Spark's others)
stays, in order. Nothing changes when ``SPARK_HOME`` is a Spark of its own (a distribution,
whose zip must match its JVM), for a master other than ``local`` (the executors' machines
have no such script), or with ``DCPKV_SPARK_WORKER_PATH=0``.

The script lives in the cache directory (``class_archive.cache_dir``), named by a hash of its
text (the interpreter and the zips it names), and is written under a name of its own and
renamed into place, so a reader never runs half a script.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from dcpkv.pipelines.class_archive import cache_dir

SWITCH = "DCPKV_SPARK_WORKER_PATH"

_SCRIPT = """#!/bin/sh
# Written by dcpkv (pipelines/worker_python.py): PySpark's zips out of PYTHONPATH, so that
# Spark's Python processes import the installed PySpark from its bytecode cache.
set -f
new=
sep=
IFS=:
for entry in $PYTHONPATH; do
  case $entry in
    {cases}) ;;
    *) new=$new$sep$entry; sep=: ;;
  esac
done
unset IFS
PYTHONPATH=$new
export PYTHONPATH
exec {python} "$@"
"""


def worker_python(master: str | None = None) -> str:
    """What ``PYSPARK_PYTHON`` should be for a session on ``master`` (module docstring): the
    script, or this interpreter when the script does not apply or cannot be written."""
    python = sys.executable
    if os.environ.get(SWITCH, "1") == "0" or not (master or "local").startswith("local"):
        return python
    zips = installed_zips()
    if not zips:
        return python
    text = script_text(python, zips)
    path = cache_dir() / f"python-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.chmod(0o755)
            os.replace(tmp, path)
    except OSError:
        return python
    return str(path)


def installed_zips() -> list[str]:
    """The zips Spark puts on its Python processes' path, when ``SPARK_HOME`` is (or will be)
    the installed PySpark's folder, as both its absolute and its real path (Spark's launcher
    may name it either way); empty otherwise."""
    import pyspark

    home = Path(pyspark.__file__).parent
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home and os.path.realpath(spark_home) != os.path.realpath(home):
        return []
    lib = home / "python" / "lib"
    names = sorted(p.name for p in lib.glob("*.zip") if p.name == "pyspark.zip" or
                   p.name.startswith("py4j-"))  # fmt: skip
    folders = dict.fromkeys([os.path.abspath(lib), os.path.realpath(lib)])
    return [os.path.join(folder, name) for folder in folders for name in names]


def script_text(python: str, zips: list[str]) -> str:
    cases = "|".join(_quoted(z) for z in zips)
    return _SCRIPT.format(cases=cases, python=_quoted(python))


def _quoted(text: str) -> str:
    """``text`` as one shell word, literally (no expansion, no pattern)."""
    return "'" + text.replace("'", "'\\''") + "'"

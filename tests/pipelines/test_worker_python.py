"""The interpreter script a local Spark runs its Python processes with: PySpark's zips out of
``PYTHONPATH`` (the processes import the installed PySpark, from its bytecode cache), every
other entry kept in order, this interpreter run; no script where it does not apply."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcpkv.pipelines.worker_python import SWITCH, installed_zips, worker_python

SHOW = "import os, sys, pyspark; print(os.environ['PYTHONPATH']); print(pyspark.__file__)"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DCPKV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.delenv(SWITCH, raising=False)
    return tmp_path / "cache"


def run(script: str, pythonpath: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run([script, "-c", SHOW], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_the_processes_import_the_installed_pyspark(cache: Path, tmp_path: Path) -> None:
    script = worker_python("local[2]")
    assert script != sys.executable and Path(script).parent == cache
    zips = installed_zips()
    assert any(z.endswith("pyspark.zip") for z in zips)
    first, second = str(tmp_path / "a"), str(tmp_path / "b c")
    path, pyspark_file = run(script, ":".join([zips[0], first, *zips[1:], "", second]))
    assert path == f"{first}::{second}"  # Spark's zips gone, the rest as it was
    assert ".zip" not in pyspark_file and pyspark_file.endswith("__init__.py")
    assert worker_python("local[*]") == script  # written once, by its text


def test_no_script_where_it_does_not_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert worker_python("spark://elsewhere:7077") == sys.executable
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))  # a Spark of its own: its zip must stay
    assert installed_zips() == [] and worker_python("local[2]") == sys.executable
    monkeypatch.delenv("SPARK_HOME")
    monkeypatch.setenv(SWITCH, "0")
    assert worker_python("local[2]") == sys.executable

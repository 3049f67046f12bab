"""The peer benchmarks of ``shared/peerbench/``, once each, for the same run's summary.

Theory of operation
-------------------
``make bench`` runs this beside the project's own benchmarks so every "dcpkv / peer" ratio in
``bench/summary.py``'s table compares two figures of one run on one (shared, noisy) machine.
Each peer script starts its own private server and stops it by PID; this runs it as it is
(``--runs 1 --json RESULTS/peer_NAME.json``) under a Python that has ``redis`` and
``hiredis``, and only when its server is on PATH:

========== ========================== ============================================
peer        needs                      script
========== ========================== ============================================
memcached   ``memcached``              ``mc_bench.py``
redis       ``redis-server``           ``redis_streams.py``
postgresql  ``pg_recvlogical``         ``pg_logical.py --no-live``
pyfloor     nothing                    ``pyfloor.py`` (the pure-Python codec floor)
========== ========================== ============================================

A missing peer is reported and skipped: ``make bench`` works on a machine without them, and a
peer that fails is reported without failing the project's benchmarks.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from _peers import PEERBENCH, peer_python

RESULTS = Path("bench/results")
PEERS: dict[str, tuple[str | None, str, list[str]]] = {
    "memcached": ("memcached", "mc_bench.py", []),
    "redis": ("redis-server", "redis_streams.py", []),
    "postgresql": ("pg_recvlogical", "pg_logical.py", ["--no-live"]),
    "pyfloor": (None, "pyfloor.py", []),
}


def run_peer(name: str, results: Path) -> str:
    binary, script, extra = PEERS[name]
    if binary is not None and shutil.which(binary) is None:
        return f"skipped: {binary} not on PATH (shared/peerbench/install.sh installs it)"
    if not (PEERBENCH / script).exists():
        return f"skipped: no {PEERBENCH / script}"
    # pyfloor needs nothing but the standard library; the others may need redis/hiredis
    exe = sys.executable if binary is None else peer_python()
    if exe is None:
        return "skipped: no Python with redis and hiredis (shared/peerbench/install.sh)"
    out = results / f"peer_{name}.json"
    cmd = [exe, script, "--runs", "1", "--json", str(out.resolve()), *extra]
    done = subprocess.run(cmd, cwd=PEERBENCH, capture_output=True, text=True)
    if done.returncode != 0:
        out.unlink(missing_ok=True)
        return f"FAILED ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}"
    return f"ok -> {out}"


def main(
    results: Annotated[Path, typer.Option(help="folder for the peers' JSON")] = RESULTS,
    only: str = typer.Option("", help="comma-separated subset of " + ",".join(PEERS)),
) -> None:
    results.mkdir(parents=True, exist_ok=True)
    for name in only.split(",") if only else PEERS:
        print(f"  peer {name:<11} {run_peer(name, results)}", flush=True)


if __name__ == "__main__":
    typer.run(main)

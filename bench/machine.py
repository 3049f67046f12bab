"""What a benchmark run ran on: the machine, and the version of everything it ran with.

Theory of operation
-------------------
``make bench`` runs this first. It prints, and with ``--json PATH`` writes for
``bench/summary.py``:

* the machine: a name for it (CPU model x logical CPUs, memory, kernel), the host name, the
  load average when the run started, the Python;
* the project: its commit (``git describe``), and every package installed in the running
  environment with its version (``make venv`` installs them from ``requirements.lock``, so
  two runs that list the same versions ran the same code);
* the peers: the servers' versions (``memcached -V``, ``redis-server --version``,
  PostgreSQL's ``postgres --version``) and the Python client the Redis peer runs with; a peer
  not installed shows as missing.

Imports nothing from dcpkv; reads ``/proc`` (Linux) and runs the peers' ``--version``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from _peers import peer_python

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = (done.stdout or done.stderr).strip()
    return out.splitlines()[0] if done.returncode == 0 and out else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def machine() -> dict[str, str]:
    cpus = os.cpu_count() or 0
    name = (f"{cpus} x {_cpu_model()}, {_memory_gib():.0f} GiB, "
            f"{platform.system()} {platform.release()}")  # fmt: skip
    return {
        "name": name,
        "host": platform.node(),
        "loadavg_at_start": " ".join(f"{load:.2f}" for load in os.getloadavg()),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "commit": _run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"]) or "unknown",
    }


def packages() -> dict[str, str]:
    """Every distribution of the running environment: name -> version."""
    found = {d.metadata["Name"]: d.version for d in metadata.distributions()}
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def _postgres() -> str | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    binary = candidates[-1] if candidates else shutil.which("postgres")
    return _run([binary, "--version"]) if binary else None


def peers() -> dict[str, str]:
    out = {
        "memcached": _run(["memcached", "-V"]),
        "redis-server": _run(["redis-server", "--version"]),
        "postgresql": _postgres(),
    }
    exe = peer_python()
    versions = "import redis, hiredis; print(redis.__version__, hiredis.__version__)"
    out["redis-py, hiredis"] = _run([exe, "-c", versions]) if exe else None
    return {name: version or "missing" for name, version in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description="the machine and versions of a benchmark run")
    parser.add_argument("--json", type=Path, help="write them here")
    args = parser.parse_args()
    body = {"machine": machine(), "peers": peers(), "packages": packages()}
    for key, value in body["machine"].items():
        print(f"  {key:<17} {value}")
    for key, value in body["peers"].items():
        print(f"  {key:<17} {value}")
    print("  packages          " + ", ".join(f"{n} {v}" for n, v in body["packages"].items()))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(body, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

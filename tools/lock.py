"""The pinned install: ``requirements.lock``, compiled from ``pyproject.toml``'s ranges.

Theory of operation
-------------------
``pyproject.toml`` declares ranges (``pyspark>=4.2``), right for people who install dcpkv as a
library and wrong for a repository whose tests, benchmarks and demo must behave the same on
every machine. ``requirements.lock`` pins one version of every package ``make venv`` installs
(the runtime dependencies, the ``dev`` extra, the build backend that installs the project
itself, and pip), each with the sha256 of every file PyPI publishes for it. ``make venv``
installs it in pip's hash-checking mode (a file whose hash is not listed, or a dependency the
lock forgot, stops the install), then the project itself, editable, with that pinned build
backend and no build isolation.

The lock is compiled by pip-tools' ``pip-compile`` (:data:`PIP_TOOLS`, in a throwaway venv:
not in the project's) against PyPI alone: this machine's local pip configuration (extra
indexes, find-links) is left out so the lock installs anywhere PyPI is reachable. An existing
lock's pins are kept unless ``--upgrade`` is given, so editing one range re-resolves only what
it touches.

Its first lines record :func:`declarations_digest`, a sha256 of the declarations it was
compiled from (``requires-python``, the dependencies, every extra, ``[build-system]
requires`` and :data:`VENV_TOOLS`), sorted, so reordering a list or editing any other part
of ``pyproject.toml`` (ruff's or mypy's settings) keeps it fresh. ``--check`` recomputes it and
exits 1 when it differs: ``make lint`` and ``make test`` (CI) run the check first.

Usage (stdlib only, any Python 3.11+)::

    python3 tools/lock.py              # make lock: refresh after editing a dependency range
    python3 tools/lock.py --upgrade    # every package to the newest its range allows
    python3 tools/lock.py --check      # exit 1 when the lock is stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import venv
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "requirements.lock"
PIP_TOOLS = "pip-tools==7.6.2"
EXTRA = "dev"  # the extra make venv installs beside the runtime dependencies
# Pinned too, though no dependency names them: pip and setuptools (``python -m venv`` installs
# whichever its Python bundles), and what hatchling asks for to install the project editable
# (its ``get_requires_for_build_editable``), as make venv installs it without build isolation.
VENV_TOOLS = ["editables", "pip", "setuptools"]
DIGEST_PREFIX = "# dependency declarations sha256: "
TOOLS_IN = "venv-tools.in"  # the build backend and VENV_TOOLS, written for pip-compile


def declarations(pyproject: dict[str, Any]) -> dict[str, Any]:
    """What the lock is compiled from, each list sorted (its order means nothing)."""
    project = pyproject.get("project", {})
    extras = project.get("optional-dependencies", {})
    return {
        "requires-python": project.get("requires-python"),
        "dependencies": sorted(project.get("dependencies", [])),
        "optional-dependencies": {name: sorted(reqs) for name, reqs in extras.items()},
        "build-system": sorted(pyproject.get("build-system", {}).get("requires", [])),
        "venv-tools": sorted(VENV_TOOLS),
    }


def declarations_digest(pyproject: dict[str, Any]) -> str:
    canonical = json.dumps(declarations(pyproject), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def recorded_digest(lock_text: str) -> str | None:
    for line in lock_text.splitlines():
        if line.startswith(DIGEST_PREFIX):
            return line.removeprefix(DIGEST_PREFIX).strip()
    return None


def stale_reason(pyproject: dict[str, Any], lock_text: str | None) -> str | None:
    """Why the lock does not match the declarations, or None when it does."""
    if lock_text is None:
        return "there is no requirements.lock"
    recorded = recorded_digest(lock_text)
    if recorded is None:
        return "requirements.lock records no digest of the declarations it was compiled from"
    if recorded != declarations_digest(pyproject):
        return "pyproject.toml's dependency declarations changed since the lock was compiled"
    return None


def header(digest: str) -> str:
    return "\n".join([
        "# The pinned install of `make venv` (tools/lock.py): every package, every file's sha256.",
        "# Compiled by pip-compile from pyproject.toml's ranges; refresh with `make lock`",
        "# (`make lock UPGRADE=1`: everything to the newest its range allows). Do not edit.",
        f"{DIGEST_PREFIX}{digest}",
        "",
    ])  # fmt: skip


def _compile_env() -> dict[str, str]:
    """The environment of pip-compile: PyPI only, whatever this machine's pip is told."""
    local = ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT")
    env = {k: v for k, v in os.environ.items() if k not in local}
    env["PIP_CONFIG_FILE"] = os.devnull  # no configuration file at all (pip's documented switch)
    return env


def compile_lock(upgrade: bool, constraint: Path | None) -> None:
    pyproject = tomllib.loads(PYPROJECT.read_text())
    with tempfile.TemporaryDirectory(prefix="dcpkv-lock-") as tmp:
        work = Path(tmp)
        venv.create(work / "venv", with_pip=True)
        pip = [str(work / "venv" / "bin" / "python"), "-m", "pip"]
        subprocess.run([*pip, "install", "--quiet", PIP_TOOLS], check=True)
        tools = work / TOOLS_IN
        tools.write_text("\n".join(declarations(pyproject)["build-system"] + VENV_TOOLS) + "\n")
        out = work / "requirements.lock"
        if LOCK.exists():
            shutil.copy(LOCK, out)  # pip-compile keeps the pins of its output file
        cmd = [
            str(work / "venv" / "bin" / "pip-compile"), "--quiet", "--generate-hashes",
            "--allow-unsafe", "--strip-extras", "--no-header", "--no-emit-index-url",
            "--no-emit-find-links", "--no-emit-trusted-host", f"--extra={EXTRA}",
            f"--output-file={out}", *(["--upgrade"] if upgrade else []),
            *([f"--constraint={constraint}"] if constraint else []),
            "pyproject.toml", str(tools),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=ROOT, env=_compile_env())
        body = out.read_text().replace(str(tools), TOOLS_IN + " (tools/lock.py)")
        if constraint is not None:
            body = body.replace(str(constraint), constraint.name)
    LOCK.write_text(header(declarations_digest(pyproject)) + body)
    print(f"wrote {LOCK.relative_to(ROOT)}")


def check() -> int:
    pyproject = tomllib.loads(PYPROJECT.read_text())
    reason = stale_reason(pyproject, LOCK.read_text() if LOCK.exists() else None)
    if reason is None:
        return 0
    print(f"stale lock: {reason}; run `make lock` and commit requirements.lock", file=sys.stderr)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the lock is stale")
    parser.add_argument("--upgrade", action="store_true", help="newest versions in range")
    parser.add_argument("--constraint", type=Path, help="a constraints file for this compile")
    args = parser.parse_args()
    if args.check:
        return check()
    compile_lock(args.upgrade, args.constraint)
    return 0


if __name__ == "__main__":
    sys.exit(main())

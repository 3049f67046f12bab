"""A benchmark as an older commit has it, run beside today's in the same run (``--before``).

Theory of operation
-------------------
Only ratios of one run hold on this machine (bench/README.md), so an engine the server no
longer has (SQLite; ``make bench`` names a commit that had it, ``SQLITE_COMMIT``) is compared
with today's by running the older commit's own copy of the same benchmark between today's
rounds: :func:`old_tree` adds a detached worktree of the commit (``git worktree add --detach``)
for the run and removes it after; :func:`run_old` runs its ``bench/SCRIPT`` there (its ``src``
first on the path, this venv's interpreter and packages) with the arguments given, prints its
rows (indented, ``|``), and returns its figures (its ``--json``), each named ``before_METRIC``.
Its own figure block is left out (the run prints one block, bench/README.md, "The output
format"); its own yardstick timings, taken around its figures, become their window
(``_report.record``), with the time it ran for the probe: their ratios are over the machine's
speed of the minutes they were measured in.
A short script runs ``times`` times over: its figures are then the medians, each run is one of
their rounds (``_report.record_round``), as today's short figures are.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _report import record, record_round

REPO = Path(__file__).resolve().parent.parent
PREFIX = "before_"
_FIGURE = re.compile(r"^\w+\.\S+ \S+ \S+$")  # a line of a figure block: NAME VALUE UNIT


@contextlib.contextmanager
def old_tree(commit: str | None) -> Iterator[Path | None]:
    """A detached worktree of ``commit`` for the block (None: no commit, no tree)."""
    if commit is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="dcpkv-before-") as tmp:
        tree = Path(tmp) / "tree"
        git = ["git", "-C", str(REPO), "worktree"]
        subprocess.run([*git, "add", "--detach", str(tree), commit], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            yield tree
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=True)


def run_old(tree: Path, script: str, args: list[str], times: int = 1) -> dict[str, float]:
    """``bench/SCRIPT ARGS`` of the old tree; its figures as ``before_METRIC`` (the median of
    ``times`` runs)."""
    if times > 1:
        runs = [_run_old_once(tree, script, args, as_round=True) for _ in range(times)]
        return {m: statistics.median(r[m] for r in runs) for m in runs[0]}
    return _run_old_once(tree, script, args, as_round=False)


def _run_old_once(tree: Path, script: str, args: list[str], as_round: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "before.json"
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        print(f"  -- {script} of {tree.name} ({_describe(tree)}): {' '.join(args)}", flush=True)
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(tree / "bench" / script), *args, "--json", str(out)],
            env=env, check=True, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        for line in done.stdout.splitlines():
            if not line.startswith(("#", "yardstick at")) and not _FIGURE.match(line):
                print(f"  | {line}")
        span = (began, time.monotonic())
        body = json.loads(out.read_text())
    figures = {PREFIX + name: float(value) for name, value in body["figures"].items()}
    if "yardstick" in body:
        start, end = body["yardstick"]["start"], body["yardstick"]["end"]
        if as_round:
            record_round(figures, start, end, span)
        else:
            record(figures, start, end, span=span)
    return figures


def _describe(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()[:60]

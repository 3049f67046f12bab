"""The commands that send the cluster manager one request each (`dcpkv cluster`, `dcpkv xdcr`,
`dcpkv user --manager`), as a user runs them: the installed script, a manager that is not
there. Each names itself in its one-line refusal and exits 1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def closed_port() -> int:
    """A port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dcpkv(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # --help: one line per option
    return subprocess.run(
        [str(BIN / "dcpkv"), *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize(
    ("command", "where"),
    [
        (["cluster", "failover", "n:11210"], "--url"),
        (["xdcr", "pause", "r/a/b"], "--url"),
        (["user", "list"], "--manager"),
    ],
)
def test_an_absent_manager_is_a_one_line_refusal_naming_the_command(
    command: list[str], where: str
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    done = dcpkv(*command, where, url)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"dcpkv {command[0]}: cannot reach the manager at {url}")
    assert done.stderr.count("\n") == 1
    assert done.stdout == ""


@pytest.mark.parametrize("command", [["cluster", "status"], ["xdcr", "status"]])
def test_the_manager_options_are_declared_with_their_help(command: list[str]) -> None:
    done = dcpkv(*command, "--help")
    assert done.returncode == 0, done.stderr
    for option, help_text in [
        ("--url", "The manager's admin API."),
        ("--user", "The cluster admin."),
        ("--password", "Its password."),
        ("--json", "Print the manager's JSON answer."),
    ]:
        line = next(line for line in done.stdout.splitlines() if f" {option} " in line)
        assert help_text in line, line

"""Prometheus text in tests: ``promtool check metrics`` over it, and its samples by name."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, from Prometheus text."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: apt-get install prometheus (make test installs it)")
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr

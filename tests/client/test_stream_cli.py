"""``dcpkv stream`` and ``dcpkv failover-log`` as subprocesses against a real server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import VBUCKETS, Writer
from serverproc import ServerProcess

from dcpkv.cli.stream import parse_vbuckets
from dcpkv.client.offsets import Offsets

ITEMS = 3000


def dcpkv(*args: str) -> list[str]:
    return [sys.executable, "-m", "dcpkv.cli.main", *args]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dcpkv(*args), capture_output=True, text=True, timeout=120)


def test_parse_vbuckets() -> None:
    assert parse_vbuckets("0,1,5-9") == [0, 1, 5, 6, 7, 8, 9]
    assert parse_vbuckets(None) is None
    for bad in ("x", "3-1", "1-"):
        with pytest.raises(ValueError):
            parse_vbuckets(bad)


def test_stream_counts_resume_and_failover_log(server: ServerProcess, tmp_path: Path) -> None:
    port = str(server.port)
    w = Writer(server.port)
    for i in range(ITEMS):
        w.set(b"item%05d" % i, b"\xff\x00" if i == 7 else b"value-%d" % i)
    offsets = tmp_path / "offsets.json"
    done = run("stream", "--port", port, "--to", "now", "--save-offsets", str(offsets))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    curr_items = int(w.c.stats(b"")["curr_items"])
    assert len(lines) == curr_items == ITEMS
    assert {rec["op"] for rec in lines} == {"mutation"}
    binary = next(rec for rec in lines if rec["key"] == "item00007")
    assert binary["value_base64"] is True and binary["value"] == "/wA="
    assert set(Offsets.load(offsets)) == set(range(VBUCKETS))
    # resume: only what changed since
    w.set(b"item00001", b"changed")
    w.delete(b"item00002")
    again = run("stream", "--port", port, "--from", str(offsets), "--to", "now",
                "--save-offsets", str(offsets))  # fmt: skip
    assert again.returncode == 0, again.stderr
    recs = [json.loads(line) for line in again.stdout.splitlines()]
    assert sorted((r["op"], r["key"], r["value"]) for r in recs) == [
        ("deletion", "item00002", None),
        ("mutation", "item00001", "changed"),
    ]
    subset = run("stream", "--port", port, "--vbuckets", "0,2-3", "--to", "now",
                 "--format", "table")  # fmt: skip
    assert subset.returncode == 0, subset.stderr
    assert {int(line.split()[1]) for line in subset.stdout.splitlines()} == {0, 2, 3}
    flog = run("failover-log", "0", "5", "--port", port, "--json")
    assert flog.returncode == 0, flog.stderr
    doc = json.loads(flog.stdout)
    assert set(doc) == {"0", "5"} and doc["0"][0]["seqno"] == 0
    table = run("failover-log", "3", "--port", port)
    assert table.returncode == 0 and "uuid" in table.stdout
    w.close()


def test_ctrl_c_saves_offsets_and_exits_zero(server: ServerProcess, tmp_path: Path) -> None:
    w = Writer(server.port)
    for i in range(200):
        w.set(b"c%d" % i, b"x")
    offsets = tmp_path / "offsets.json"
    proc = subprocess.Popen(
        dcpkv("stream", "--port", str(server.port), "--save-offsets", str(offsets)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for _ in range(200):  # every existing item, then the stream waits for more
            assert proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    saved = Offsets.load(offsets)
    assert sum(saved[vb].seqno for vb in saved) == 200
    w.close()
